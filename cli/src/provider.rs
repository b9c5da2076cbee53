//! `--provider anthropic|openai` and its options, shared by `glia run`,
//! `glia worker` and `glia dev`: which real model provider to call, where,
//! with which key, and at which prices.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Args;
use glia_providers::http::{HttpProvider, Wire};
use glia_providers::{PriceTable, ProviderConfig, ProviderKind, ProviderMetrics, RateLimiter, RateLimits, RefusalIsolator};
use glia_worker::provider::Provider;

/// Options naming a real model provider.
#[derive(Args, Clone, Debug, Default)]
pub struct ProviderArgs {
    /// Call a real model provider: `anthropic` (Messages API) or `openai`
    /// (Chat Completions: OpenAI, vLLM, Ollama, llama.cpp server, OpenRouter).
    #[arg(long, value_name = "anthropic|openai")]
    pub provider: Option<ProviderKind>,
    /// The provider's base URL; default its public endpoint. For
    /// OpenAI-compatible servers include the `/v1` (e.g. `http://host:8000/v1`).
    #[arg(long, value_name = "URL", requires = "provider")]
    pub base_url: Option<String>,
    /// Environment variable holding the API key; default `ANTHROPIC_API_KEY`
    /// or `OPENAI_API_KEY`.
    #[arg(long, value_name = "VAR", requires = "provider")]
    pub api_key_env: Option<String>,
    /// Send no API key when the variable is unset (keyless local servers).
    #[arg(long, requires = "provider")]
    pub allow_missing_key: bool,
    /// Price table (JSON, USD per million tokens by provider and model; see
    /// `providers/prices.example.json`) for the runs' cost accounting.
    #[arg(long, value_name = "FILE", requires = "provider")]
    pub prices: Option<PathBuf>,
}

impl ProviderArgs {
    /// Refuse provider options given without `--provider` (clap's
    /// `requires` is not enforced when `--provider` conflicts with another
    /// option present, such as `--script`).
    pub fn check(&self) -> Result<()> {
        if self.provider.is_none() {
            let given = [
                ("--base-url", self.base_url.is_some()),
                ("--api-key-env", self.api_key_env.is_some()),
                ("--allow-missing-key", self.allow_missing_key),
                ("--prices", self.prices.is_some()),
            ];
            if let Some((name, _)) = given.iter().find(|(_, present)| *present) {
                anyhow::bail!("{name} only applies with --provider");
            }
        }
        Ok(())
    }

    /// The provider config these options describe, for `kind`.
    pub fn config(&self, kind: ProviderKind) -> ProviderConfig {
        ProviderConfig {
            kind,
            base_url: self.base_url.clone(),
            api_key_env: self.api_key_env.clone(),
            allow_missing_key: self.allow_missing_key,
            ..ProviderConfig::new(kind)
        }
    }

    /// The price table named by `--prices`, if any.
    pub fn price_table(&self) -> Result<Option<PriceTable>> {
        self.prices.as_ref().map(|path| PriceTable::from_file(path).context("loading --prices")).transpose()
    }

    /// A provider for a fleet worker: retries, refusal isolation, prices from
    /// `--prices` for runs whose config has none, and the fleet-wide rate
    /// limiter when `limiter` is given (Redis URL, key prefix, limits, and
    /// where to report its connection: a Redis that is down is waited for,
    /// retried with backoff, as `rate_limiter` in `/readyz`), counted in
    /// `metrics` when given. A missing key fails first, before anything
    /// connects.
    pub async fn fleet_provider(&self, kind: ProviderKind, limiter: Option<(&str, &str, RateLimits, &glia_dispatcher::Startup)>, metrics: Option<ProviderMetrics>) -> Result<Arc<dyn Provider>> {
        let config = self.config(kind);
        config.api_key()?;
        let prices = self.price_table()?;
        let limiter = match limiter {
            Some((url, prefix, limits, startup)) => {
                let connect = || RateLimiter::connect(url, prefix, limits);
                Some(Arc::new(crate::fleet::wait_for("rate_limiter", "Redis (the provider rate limiter)", startup, connect).await))
            }
            None => None,
        };
        Ok(match kind {
            ProviderKind::Anthropic => assemble(glia_providers::anthropic_provider(&config)?, limiter, prices, metrics),
            ProviderKind::Openai => assemble(glia_providers::openai_provider(&config)?, limiter, prices, metrics),
        })
    }
}

fn assemble<W: Wire>(provider: HttpProvider<W>, limiter: Option<Arc<RateLimiter>>, prices: Option<PriceTable>, metrics: Option<ProviderMetrics>) -> Arc<dyn Provider> {
    let provider = match metrics {
        Some(m) => provider.with_metrics(m),
        None => provider,
    };
    let provider = match limiter {
        Some(l) => provider.with_rate_limiter(l),
        None => provider,
    };
    let provider = match prices {
        Some(t) => provider.with_prices(t),
        None => provider,
    };
    Arc::new(RefusalIsolator::new(Arc::new(provider)))
}
