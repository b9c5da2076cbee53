//! Choosing and configuring a provider: which wire format, where, with which
//! key. API keys come from environment variables named in the config; the
//! key itself is held in an [`ApiKey`] that never prints.

use std::fmt;

use serde::{Deserialize, Serialize};

use glia_proto::provider::{ProviderKind, UnknownProviderKind};

/// How to reach one provider. JSON example: `{"kind": "anthropic",
/// "base_url": "http://127.0.0.1:8080", "api_key_env": "ANTHROPIC_API_KEY"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProviderConfig {
    /// Wire format.
    pub kind: ProviderKind,
    /// Base URL; `None` = the kind's public endpoint. For Anthropic the
    /// path `/v1/messages` is appended; for OpenAI-compatible servers
    /// `/chat/completions` (so give `http://host:8000/v1` for vLLM).
    #[serde(default)]
    pub base_url: Option<String>,
    /// Name of the environment variable holding the API key; `None` = the
    /// kind's default (`ANTHROPIC_API_KEY` / `OPENAI_API_KEY`).
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// When true a missing key is allowed and no auth header is sent (local
    /// vLLM, Ollama, llama.cpp servers). Default false: a missing key is a
    /// [`ConfigError::MissingKey`].
    #[serde(default)]
    pub allow_missing_key: bool,
    /// When set, every request uses this model instead of the run's.
    #[serde(default)]
    pub model: Option<String>,
}

impl ProviderConfig {
    /// A config for `kind` with every other field at its default.
    pub fn new(kind: ProviderKind) -> Self {
        ProviderConfig {
            kind,
            base_url: None,
            api_key_env: None,
            allow_missing_key: false,
            model: None,
        }
    }

    /// The base URL in use, without a trailing slash.
    pub fn base_url(&self) -> String {
        self.base_url
            .as_deref()
            .unwrap_or(self.kind.default_base_url())
            .trim_end_matches('/')
            .to_owned()
    }

    /// The key environment variable in use.
    pub fn key_env(&self) -> &str {
        self.api_key_env
            .as_deref()
            .unwrap_or(self.kind.default_key_env())
    }

    /// Read the key from the environment.
    ///
    /// Errors: [`ConfigError::MissingKey`] when the variable is unset or
    /// empty and `allow_missing_key` is false (the message names the
    /// variable, never a value).
    pub fn api_key(&self) -> Result<Option<ApiKey>, ConfigError> {
        let var = self.key_env();
        match std::env::var(var) {
            Ok(v) if !v.trim().is_empty() => Ok(Some(ApiKey::new(v.trim()))),
            _ if self.allow_missing_key => Ok(None),
            _ => Err(ConfigError::MissingKey {
                var: var.to_owned(),
                kind: self.kind.name(),
            }),
        }
    }
}

/// A provider could not be configured.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// The API key variable is unset or empty.
    #[error(
        "no API key for the {kind} provider: set the environment variable {var} (or name another variable with api_key_env / --api-key-env)"
    )]
    MissingKey {
        /// The variable that was read.
        var: String,
        /// `anthropic` / `openai`.
        kind: &'static str,
    },
    /// The provider kind is not known.
    #[error("unknown provider kind {0:?}: expected anthropic or openai")]
    UnknownKind(String),
    /// The base URL does not parse or is not http(s).
    #[error("invalid base URL {url:?}: {reason}")]
    BadUrl {
        /// The URL given.
        url: String,
        /// Why it was refused.
        reason: String,
    },
    /// The HTTP client could not be built.
    #[error("HTTP client: {0}")]
    Http(String),
}

/// An API key. `Debug` and `Display` print `ApiKey(***)`; the value is only
/// reachable through [`ApiKey::expose`], which the adapters call when
/// setting the auth header.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(String);

impl ApiKey {
    /// Wrap a key.
    pub fn new(key: impl Into<String>) -> Self {
        ApiKey(key.into())
    }

    /// The key itself, for the auth header only.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// `text` with every occurrence of the key replaced by `[redacted]`.
    /// Applied to every error message built from a response or a
    /// transport error.
    pub fn redact(&self, text: &str) -> String {
        if self.0.len() < 4 {
            text.to_owned()
        } else {
            text.replace(&self.0, "[redacted]")
        }
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey(***)")
    }
}

impl fmt::Display for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey(***)")
    }
}

/// Redact `text` with `key` when there is one.
pub(crate) fn redact(key: Option<&ApiKey>, text: &str) -> String {
    key.map_or_else(|| text.to_owned(), |k| k.redact(text))
}

impl From<UnknownProviderKind> for ConfigError {
    fn from(e: UnknownProviderKind) -> Self {
        ConfigError::UnknownKind(e.0)
    }
}
