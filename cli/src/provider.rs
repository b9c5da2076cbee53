//! `--provider anthropic|openai` and its options, shared by `glia run`,
//! `glia worker` and `glia dev`: which real model provider to call, where,
//! with which key, and at which prices.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Args;
use glia_agent::catalogue::Catalogue;
use glia_agent::provider::Provider;
use glia_proto::ProviderKind;
use glia_providers::http::{HttpProvider, Wire};
use glia_providers::{
    PriceTable, ProviderConfig, ProviderMetrics, RateLimiter, RateLimits, RefusalIsolator,
};

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
    /// `providers/prices.example.json`) for the runs' cost accounting: of
    /// `--provider`'s calls and of the catalogue's providers'.
    #[arg(long, value_name = "FILE")]
    pub prices: Option<PathBuf>,
}

impl ProviderArgs {
    /// Refuse provider options given without `--provider` (clap's
    /// `requires` is not enforced when `--provider` conflicts with another
    /// option present, such as `--script`); `--prices` also serves
    /// `named_providers` (the catalogue's).
    pub fn check(&self, named_providers: bool) -> Result<()> {
        if self.provider.is_none() {
            let given = [
                ("--base-url", self.base_url.is_some()),
                ("--api-key-env", self.api_key_env.is_some()),
                ("--allow-missing-key", self.allow_missing_key),
                ("--prices", self.prices.is_some() && !named_providers),
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
        self.prices
            .as_ref()
            .map(|path| PriceTable::from_file(path).context("loading --prices"))
            .transpose()
    }

    /// A provider for a fleet worker: retries, refusal isolation, prices from
    /// `--prices` for runs whose config has none, and the fleet-wide rate
    /// limiter when `limiter` is given (Redis URL, key prefix, limits, and
    /// where to report its connection: a Redis that is down is waited for,
    /// retried with backoff, as `rate_limiter` in `/readyz`), counted in
    /// `metrics` when given. A missing key fails first, before anything
    /// connects.
    pub async fn fleet_provider(
        &self,
        kind: ProviderKind,
        limiter: Option<(&str, &str, RateLimits, &glia_dispatcher::Startup)>,
        metrics: Option<ProviderMetrics>,
    ) -> Result<Arc<dyn Provider>> {
        let config = self.config(kind);
        config.api_key()?;
        build(&config, limiter, self.price_table()?, metrics).await
    }

    /// The catalogue's providers (`[providers.NAME]`), each built as
    /// [`ProviderArgs::fleet_provider`] builds `--provider`'s: its base URL,
    /// the key from its variable, the `--prices` table, and, when `redis`
    /// is given (URL, key prefix, where to report the connection), the
    /// fleet-wide rate limiter with the entry's limits under the key prefix
    /// `{prefix}:provider:{NAME}:`, so two entries of one kind never share
    /// buckets. Without Redis the entry's limits are not enforced (a
    /// warning says so). Errors: a key variable that is not set.
    pub async fn catalogue_providers(
        &self,
        catalogue: &Catalogue,
        redis: Option<(&str, &str, &glia_dispatcher::Startup)>,
        metrics: Option<ProviderMetrics>,
    ) -> Result<Vec<(String, Arc<dyn Provider>)>> {
        let prices = self.price_table()?;
        let mut built = Vec::new();
        for (name, entry) in &catalogue.providers {
            let kind = entry.kind;
            let config = ProviderConfig {
                base_url: Some(entry.base_url.clone()),
                api_key_env: Some(entry.api_key_env.clone()),
                ..ProviderConfig::new(kind)
            };
            config
                .api_key()
                .with_context(|| format!("catalogue providers.{name}"))?;
            let limits = RateLimits {
                requests_per_minute: entry.requests_per_minute.map_or(0, u64::from),
                input_tokens_per_minute: entry.input_tokens_per_minute.map_or(0, u64::from),
                output_tokens_per_minute: entry.output_tokens_per_minute.map_or(0, u64::from),
                resume_spacing_ms: None,
            };
            let limited = entry
                .requests_per_minute
                .or(entry.input_tokens_per_minute)
                .or(entry.output_tokens_per_minute)
                .is_some();
            if redis.is_none() && limited {
                tracing::warn!(provider = %name, "the catalogue's rate limits are enforced only with Redis (glia worker, or glia dev --services)");
            }
            let prefix = redis.map(|(_, prefix, _)| format!("{prefix}:provider:{name}:"));
            let limiter = redis
                .zip(prefix.as_deref())
                .map(|((url, _, startup), prefix)| (url, prefix, limits, startup));
            let provider = build(&config, limiter, prices.clone(), metrics.clone()).await?;
            let provider: Arc<dyn Provider> = if entry.images {
                provider
            } else {
                Arc::new(glia_agent::provider::TextOnly(provider))
            };
            built.push((name.clone(), provider));
        }
        Ok(built)
    }
}

/// A provider of `config`'s kind: retries, refusal isolation, `prices`,
/// counted in `metrics`, and the fleet-wide rate limiter when `limiter` is
/// given (Redis URL, key prefix, limits, where to report its connection: a
/// Redis that is down is waited for). The caller checks the API key first.
async fn build(
    config: &ProviderConfig,
    limiter: Option<(&str, &str, RateLimits, &glia_dispatcher::Startup)>,
    prices: Option<PriceTable>,
    metrics: Option<ProviderMetrics>,
) -> Result<Arc<dyn Provider>> {
    let limiter = match limiter {
        Some((url, prefix, limits, startup)) => {
            let connect = || RateLimiter::connect(url, prefix, limits);
            Some(Arc::new(
                crate::ports::wait_for(
                    "rate_limiter",
                    "Redis (the provider rate limiter)",
                    startup,
                    connect,
                )
                .await,
            ))
        }
        None => None,
    };
    Ok(match config.kind {
        ProviderKind::Anthropic => assemble(
            glia_providers::anthropic_provider(config)?,
            limiter,
            prices,
            metrics,
        ),
        ProviderKind::Openai => assemble(
            glia_providers::openai_provider(config)?,
            limiter,
            prices,
            metrics,
        ),
    })
}

fn assemble<W: Wire>(
    provider: HttpProvider<W>,
    limiter: Option<Arc<RateLimiter>>,
    prices: Option<PriceTable>,
    metrics: Option<ProviderMetrics>,
) -> Arc<dyn Provider> {
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
