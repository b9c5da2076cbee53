//! Reading configuration files strictly (`glia run --config`, `glia submit
//! --config`, `glia agents apply`).
//!
//! Files are TOML (`.toml`) or JSON (anything else); both are parsed by
//! [`glia_proto::strict`], so an unknown key or a wrong type is an error
//! naming the file and the field (`agents/support.toml: guardrails.input[0].dny:
//! unknown field`).

use std::path::Path;

use anyhow::{Context, Result};
use glia_proto::RunConfig;
use serde::de::DeserializeOwned;

/// Parse `path` strictly as `T` (`what` it is, for errors): TOML when it
/// ends in `.toml`, else JSON. Errors name the file and the field
/// (`a.json: invalid run config: compactor: unknown field`).
pub fn read_strict<T: DeserializeOwned>(path: &Path, what: &str) -> Result<T> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let parsed = if path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("toml"))
    {
        glia_proto::strict::from_toml_str(&text)
    } else {
        glia_proto::strict::from_json_str(&text)
    };
    parsed.map_err(|e| anyhow::anyhow!("{}: invalid {what}: {e}", path.display()))
}

/// A run configuration file (`--config`), parsed strictly and validated.
pub fn read_config(path: &Path) -> Result<RunConfig> {
    let config: RunConfig = read_strict(path, "run config")?;
    config
        .validate()
        .map_err(|e| anyhow::anyhow!("{}: invalid run config: {e}", path.display()))?;
    Ok(config)
}
