//! glia-providers: real model providers behind glia's provider boundary
//! ([`glia_proto::provider::Provider`]).
//!
//! - [`anthropic`]: the Anthropic Messages API (streaming and not, prompt
//!   caching breakpoints, tools, extended thinking);
//! - [`openai`]: OpenAI-compatible Chat Completions (OpenAI, vLLM, Ollama,
//!   llama.cpp server, OpenRouter), with the known server quirks;
//! - [`http`]: the shared engine: transport, error classification, retries
//!   with backoff honouring `retry-after` / `retry-after-ms` /
//!   `x-should-retry`, rate-limit permits, metrics;
//! - [`ratelimit`]: fleet-wide token buckets and cooldowns (the [`Limiter`]
//!   port; in Redis with the `redis` feature);
//! - [`pricing`]: the operator's price table, cost in USD micros;
//! - [`estimate`]: token usage when a provider reports none (tiktoken-rs
//!   for OpenAI models, a conservative bytes/3 otherwise), marked
//!   `estimated`;
//! - [`refusal`]: isolating and eliding the one message a provider refuses;
//! - [`config`]: which provider, where, and the API key (from an environment
//!   variable; never printed);
//! - [`metrics`]: Prometheus counters.
//!
//! ```no_run
//! use glia_proto::ProviderKind;
//! use glia_providers::{ProviderConfig, from_config};
//! let mut config = ProviderConfig::new(ProviderKind::Anthropic);
//! config.base_url = Some("http://127.0.0.1:8080".into());
//! let provider = from_config(&config).expect("ANTHROPIC_API_KEY is set");
//! # let _ = provider;
//! ```

#![warn(missing_docs)]

pub mod anthropic;
pub mod clock;
pub mod config;
pub mod error;
pub mod estimate;
pub mod http;
pub mod metrics;
pub mod openai;
pub mod pricing;
pub mod ratelimit;
#[cfg(feature = "redis")]
pub mod redis_limiter;
pub mod refusal;

use std::sync::Arc;

pub use anthropic::Anthropic;
pub use clock::{Clock, SystemClock};
pub use config::{ApiKey, ConfigError, ProviderConfig};
pub use error::CallError;
pub use http::{CallObserver, HttpProvider, RetryEvent, RetryPolicy, Wire};
pub use metrics::ProviderMetrics;
pub use openai::OpenAi;
pub use pricing::{PriceError, PriceTable};
pub use ratelimit::{Limiter, RateCost, RateKey, RateLimits};
#[cfg(feature = "redis")]
pub use redis_limiter::{RateLimitError, RateLimiter};
pub use refusal::{Elision, ElisionObserver, RefusalIsolator};

use glia_proto::provider::{Provider, ProviderKind};

fn checked_base_url(config: &ProviderConfig) -> Result<String, ConfigError> {
    let url = config.base_url();
    let parsed = reqwest::Url::parse(&url).map_err(|e| ConfigError::BadUrl {
        url: url.clone(),
        reason: e.to_string(),
    })?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(ConfigError::BadUrl {
            url,
            reason: "the scheme must be http or https".into(),
        });
    }
    Ok(url)
}

fn build<W: Wire>(wire: W, config: &ProviderConfig) -> Result<HttpProvider<W>, ConfigError> {
    let base = checked_base_url(config)?;
    let key = config.api_key()?;
    let client = http::http_client().map_err(|e| ConfigError::Http(e.to_string()))?;
    let p = HttpProvider::new(wire, client, &base, key);
    Ok(match &config.model {
        Some(m) => p.with_model(m.clone()),
        None => p,
    })
}

/// An Anthropic Messages provider for `config` (default wire options),
/// to customise with the `with_*` methods before use.
///
/// Errors: [`ConfigError::MissingKey`] when the key variable is unset,
/// [`ConfigError::BadUrl`] for a base URL that is not http(s).
pub fn anthropic_provider(config: &ProviderConfig) -> Result<HttpProvider<Anthropic>, ConfigError> {
    build(Anthropic::default(), config)
}

/// An OpenAI-compatible Chat Completions provider for `config`; see
/// [`anthropic_provider`].
pub fn openai_provider(config: &ProviderConfig) -> Result<HttpProvider<OpenAi>, ConfigError> {
    build(OpenAi::default(), config)
}

/// The provider `config` describes, streaming, with the default retry
/// policy, no fleet rate limiter, and refusal isolation.
///
/// This is what `glia run --provider anthropic|openai --base-url URL` needs:
/// `ProviderConfig { kind, base_url: Some(url), ..ProviderConfig::new(kind) }`.
///
/// Errors: [`ConfigError::MissingKey`] (its message names the variable to
/// set), [`ConfigError::BadUrl`], [`ConfigError::Http`].
pub fn from_config(config: &ProviderConfig) -> Result<Arc<dyn Provider>, ConfigError> {
    let inner: Arc<dyn Provider> = match config.kind {
        ProviderKind::Anthropic => Arc::new(anthropic_provider(config)?),
        ProviderKind::Openai => Arc::new(openai_provider(config)?),
    };
    Ok(Arc::new(RefusalIsolator::new(inner)))
}
