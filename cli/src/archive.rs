//! `glia export` and `glia import`: move runs between a single node's SQLite
//! file and a fleet's Postgres (either way), in the JSON Lines format of
//! `glia_backends::archive` (format `glia-runs`, version 3).

use std::io::{BufRead, BufWriter, Write};
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use clap::Args;
use glia_backends::archive::{Archive, ArchiveHeader, Imported, RunRecord};
use glia_backends::postgres::{PgLog, PgOptions};
use glia_backends::sqlite::{SqliteLog, SqliteOptions};
use glia_backends::{RunFilter, RunStatus};

/// The store to read from or write to: exactly one of the two.
#[derive(Args, Clone)]
pub struct StoreArgs {
    /// A single node's SQLite file (the node must be stopped: the file is
    /// locked by the process that has it open).
    #[arg(long, value_name = "FILE", conflicts_with = "database_url")]
    pub data: Option<PathBuf>,
    /// A fleet's Postgres.
    #[arg(long, value_name = "URL")]
    pub database_url: Option<String>,
}

impl StoreArgs {
    /// Open the store (Postgres migrations and the SQLite file's lock and
    /// migrations happen here) and name it for the header.
    async fn open(&self) -> Result<(Arc<dyn Archive>, String)> {
        match (&self.data, &self.database_url) {
            (Some(path), _) => {
                if !path.exists() {
                    bail!("{} does not exist", path.display());
                }
                let log = SqliteLog::open(path, SqliteOptions::default())
                    .await
                    .with_context(|| format!("opening {}", path.display()))?;
                Ok((Arc::new(log), format!("sqlite:{}", path.display())))
            }
            (None, Some(url)) => {
                let log = PgLog::connect(
                    url,
                    PgOptions {
                        max_connections: 2,
                        ..PgOptions::default()
                    },
                )
                .await
                .context("connecting to Postgres")?;
                let config: tokio_postgres::Config =
                    url.parse().context("parsing the database URL")?;
                let host = config
                    .get_hosts()
                    .first()
                    .map(|h| match h {
                        tokio_postgres::config::Host::Tcp(name) => name.clone(),
                        tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
                    })
                    .unwrap_or_default();
                Ok((
                    Arc::new(log),
                    format!("postgres:{host}/{}", config.get_dbname().unwrap_or("")),
                ))
            }
            (None, None) => bail!(
                "name the store: --data FILE (a single node) or --database-url URL (a fleet's Postgres)"
            ),
        }
    }
}

/// `glia export`.
#[derive(Args)]
pub struct ExportArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    /// Write here (written to FILE.partial, renamed when complete); default
    /// standard output.
    #[arg(long, short, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Only runs with this status (runnable, parked, done).
    #[arg(long, value_parser = parse_status)]
    pub status: Option<RunStatus>,
}

/// `glia import`.
#[derive(Args)]
pub struct ImportArgs {
    /// A file written by `glia export`.
    pub file: PathBuf,
    #[command(flatten)]
    pub store: StoreArgs,
}

fn parse_status(s: &str) -> Result<RunStatus, String> {
    s.parse()
}

/// Every run of the store (or of one status), in run id order, one line each
/// after the header. Prints the count on stderr.
pub async fn export(args: ExportArgs) -> Result<()> {
    let (log, source) = args.store.open().await?;
    let (mut out, partial): (Box<dyn Write>, Option<PathBuf>) = match &args.out {
        Some(path) => {
            let mut partial = path.clone().into_os_string();
            partial.push(".partial");
            let partial = PathBuf::from(partial);
            let file = std::fs::File::create(&partial)
                .with_context(|| format!("creating {}", partial.display()))?;
            (Box::new(BufWriter::new(file)), Some(partial))
        }
        None => (Box::new(BufWriter::new(std::io::stdout().lock())), None),
    };
    serde_json::to_writer(&mut out, &ArchiveHeader::new(source))?;
    out.write_all(b"\n")?;
    let mut filter = RunFilter {
        status: args.status,
        limit: 1000,
        ..RunFilter::default()
    };
    let mut n = 0usize;
    loop {
        let page = log.list_runs(&filter).await.context("listing runs")?;
        for run in &page {
            let record = log
                .export_run(run.run_id)
                .await
                .with_context(|| format!("exporting run {}", run.run_id))?;
            serde_json::to_writer(&mut out, &record)?;
            out.write_all(b"\n")?;
            n += 1;
        }
        match page.last() {
            Some(last) if page.len() == filter.limit => filter.before = Some(last.run_id),
            _ => break,
        }
    }
    out.flush()?;
    drop(out);
    if let (Some(partial), Some(path)) = (partial, &args.out) {
        std::fs::rename(&partial, path)
            .with_context(|| format!("renaming {} to {}", partial.display(), path.display()))?;
    }
    errln!("exported {n} run(s)");
    Ok(())
}

/// Each run in its own transaction; a run already present at the same head
/// is skipped, so an interrupted import can be run again. Stops at the first
/// line that does not parse or import, naming it; runs before it stay
/// imported.
pub async fn import(args: ImportArgs) -> Result<()> {
    let file = std::fs::File::open(&args.file)
        .with_context(|| format!("opening {}", args.file.display()))?;
    let mut lines = std::io::BufReader::new(file).lines();
    let first = lines
        .next()
        .transpose()?
        .with_context(|| format!("{} is empty", args.file.display()))?;
    let header = ArchiveHeader::parse(&first)
        .map_err(anyhow::Error::msg)
        .with_context(|| format!("{} line 1", args.file.display()))?;
    let (log, _) = args.store.open().await?;
    let (mut created, mut present) = (0usize, 0usize);
    for (i, line) in lines.enumerate() {
        let number = i + 2;
        let line =
            line.with_context(|| format!("reading {} line {number}", args.file.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        let record: RunRecord = serde_json::from_str(&line).with_context(|| {
            format!("{} line {number} is not a run record", args.file.display())
        })?;
        match log.import_run(&record).await {
            Ok(Imported::Created) => created += 1,
            Ok(Imported::AlreadyPresent) => present += 1,
            Err(e) => bail!(
                "{} line {number} (run {}): {e}; {created} run(s) imported before it",
                args.file.display(),
                record.run_id
            ),
        }
    }
    errln!(
        "imported {created} run(s) from {} ({present} already present)",
        header.source
    );
    Ok(())
}
