//! `glia agents apply|list|show` and `glia schemas`. Definition files are
//! read strictly by [`crate::config_file`].

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use glia_proto::AgentDefinition;
use reqwest::Method;
use serde_json::Value;

use crate::client::{Server, http_client};
use crate::config_file::read_strict;

/// `glia agents`.
#[derive(Subcommand)]
pub enum AgentsCommand {
    /// Register agent definitions (a `.toml` or `.json` file, or every such
    /// file in a directory) on a dispatcher. Idempotent: content already
    /// registered as the latest version is `unchanged`; new content becomes
    /// the next version. Every file is checked before anything is sent.
    Apply {
        #[command(flatten)]
        server: Server,
        /// A definition file, or a directory of them.
        path: PathBuf,
    },
    /// List the tenant's agents (latest version of each).
    List {
        #[command(flatten)]
        server: Server,
        /// Print the API's answer (JSON) instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Print an agent's definition (`NAME`: the latest; `NAME@VERSION`).
    Show {
        #[command(flatten)]
        server: Server,
        /// `NAME` or `NAME@VERSION`.
        agent: String,
    },
}

/// The definition files at `path`: the file itself, or a directory's
/// `.toml` and `.json` files, by name.
fn definition_files(path: &Path) -> Result<Vec<PathBuf>> {
    if !path.is_dir() {
        return Ok(vec![path.to_owned()]);
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(path)
        .with_context(|| format!("reading {}", path.display()))?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .filter(|p| p.is_file() && p.extension().is_some_and(|e| e == "toml" || e == "json"))
        .collect();
    files.sort();
    if files.is_empty() {
        bail!("{}: no .toml or .json definitions", path.display());
    }
    Ok(files)
}

/// Run a `glia agents` command.
pub async fn agents(cmd: AgentsCommand) -> Result<()> {
    let client = http_client()?;
    match cmd {
        AgentsCommand::Apply { server, path } => {
            let mut definitions = Vec::new();
            let mut names = std::collections::HashMap::new();
            for file in definition_files(&path)? {
                let def: AgentDefinition = read_strict(&file, "agent definition")?;
                def.validate().map_err(|e| {
                    anyhow::anyhow!("{}: invalid agent definition: {e}", file.display())
                })?;
                if let Some(other) = names.insert(def.name.clone(), file.clone()) {
                    bail!(
                        "{} and {} both define agent '{}'",
                        other.display(),
                        file.display(),
                        def.name
                    );
                }
                definitions.push((file, def));
            }
            for (file, def) in definitions {
                let body = serde_json::to_value(&def)?;
                let answer = server
                    .call(
                        &client,
                        Method::PUT,
                        &format!("/v1/agents/{}", def.name),
                        Some(&body),
                        &[],
                    )
                    .await?;
                let created = answer.status == reqwest::StatusCode::CREATED;
                let v = answer
                    .checked()
                    .with_context(|| format!("applying {}", file.display()))?;
                outln!(
                    "{}: agent {} {} (version {}, {})",
                    file.display(),
                    def.name,
                    if created { "created" } else { "unchanged" },
                    v["version"],
                    v["content_hash"].as_str().unwrap_or("")
                );
            }
            Ok(())
        }
        AgentsCommand::List { server, json } => {
            let list = server
                .call(&client, Method::GET, "/v1/agents", None, &[])
                .await?
                .checked()?;
            if json {
                return crate::client::print_json(&list);
            }
            outln!(
                "{:<24} {:>7}  {:<28} DESCRIPTION",
                "NAME",
                "VERSION",
                "MODEL"
            );
            for a in list["agents"].as_array().into_iter().flatten() {
                let d = &a["definition"];
                outln!(
                    "{:<24} {:>7}  {:<28} {}",
                    text(&a["name"]),
                    a["version"],
                    text(&d["model"]),
                    text(&d["description"])
                );
            }
            Ok(())
        }
        AgentsCommand::Show { server, agent } => {
            let path = match agent.split_once('@') {
                Some((name, v)) => format!("/v1/agents/{name}/versions/{v}"),
                None => format!("/v1/agents/{agent}"),
            };
            let v = server
                .call(&client, Method::GET, &path, None, &[])
                .await?
                .checked()?;
            outln!("{}", serde_json::to_string_pretty(&v)?);
            Ok(())
        }
    }
}

fn text(v: &Value) -> &str {
    v.as_str().unwrap_or("")
}

/// `glia schemas`.
#[derive(Args)]
pub struct SchemasArgs {
    /// Directory to write the schemas and the OpenAPI document to.
    #[arg(long, default_value = "schemas")]
    pub out: PathBuf,
}

/// Write the JSON Schema of each configuration file type (the same schemas
/// `/openapi.json` serves), for editors to validate files with, and the
/// OpenAPI document itself (`openapi.json`), which the clients under
/// `clients/` are generated from and checked against.
pub fn schemas(args: SchemasArgs) -> Result<()> {
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let documents = glia_dispatcher::docs::config_schemas()
        .into_iter()
        .chain([("openapi.json", glia_dispatcher::openapi())]);
    for (file, schema) in documents {
        let path = args.out.join(file);
        std::fs::write(
            &path,
            format!("{}\n", serde_json::to_string_pretty(&schema)?),
        )
        .with_context(|| format!("writing {}", path.display()))?;
        outln!("{}", path.display());
    }
    Ok(())
}
