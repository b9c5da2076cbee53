//! Prometheus metrics of provider calls (prometheus-client, which appends
//! `_total` to counter names itself).
//!
//! - `glia_provider_requests_total{provider, model, outcome}`: calls, by
//!   outcome (`ok` or a [`crate::CallError::kind`]), after retries;
//! - `glia_provider_retries_total{provider, model, reason}`: retried attempts;
//! - `glia_provider_tokens_total{provider, model, kind}`: tokens of
//!   successful calls (`input`, `output`, `cache_write`, `cache_read`);
//! - `glia_provider_rate_limit_wait_seconds_total{provider, model}`: time
//!   spent waiting for the fleet rate limiter.

use std::time::Duration;

use glia_proto::Usage;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

type Labels = Vec<(String, String)>;

/// The provider counters. Clones share the same counters.
#[derive(Debug, Clone, Default)]
pub struct ProviderMetrics {
    requests: Family<Labels, Counter>,
    retries: Family<Labels, Counter>,
    tokens: Family<Labels, Counter>,
    wait_seconds: Family<Labels, Counter<f64>>,
}

fn labels(provider: &str, model: &str, extra: Option<(&str, &str)>) -> Labels {
    let mut l = vec![
        ("provider".to_owned(), provider.to_owned()),
        ("model".to_owned(), model.to_owned()),
    ];
    if let Some((k, v)) = extra {
        l.push((k.to_owned(), v.to_owned()));
    }
    l
}

impl ProviderMetrics {
    /// New counters, registered in `registry` under the names above.
    pub fn register(registry: &mut Registry) -> Self {
        let m = ProviderMetrics::default();
        registry.register(
            "glia_provider_requests",
            "Model calls by outcome, after retries",
            m.requests.clone(),
        );
        registry.register(
            "glia_provider_retries",
            "Retried model call attempts by reason",
            m.retries.clone(),
        );
        registry.register(
            "glia_provider_tokens",
            "Tokens of successful model calls by kind",
            m.tokens.clone(),
        );
        registry.register(
            "glia_provider_rate_limit_wait_seconds",
            "Seconds spent waiting for the fleet rate limiter",
            m.wait_seconds.clone(),
        );
        m
    }

    pub(crate) fn request(&self, provider: &str, model: &str, outcome: &str) {
        self.requests
            .get_or_create(&labels(provider, model, Some(("outcome", outcome))))
            .inc();
    }

    pub(crate) fn retry(&self, provider: &str, model: &str, reason: &str) {
        self.retries
            .get_or_create(&labels(provider, model, Some(("reason", reason))))
            .inc();
    }

    pub(crate) fn tokens(&self, provider: &str, model: &str, usage: &Usage) {
        for (kind, n) in [
            ("input", usage.input_tokens),
            ("output", usage.output_tokens),
            ("cache_write", usage.cache_write_tokens),
            ("cache_read", usage.cache_read_tokens),
        ] {
            self.tokens
                .get_or_create(&labels(provider, model, Some(("kind", kind))))
                .inc_by(n);
        }
    }

    pub(crate) fn rate_limit_wait(&self, provider: &str, model: &str, wait: Duration) {
        self.wait_seconds
            .get_or_create(&labels(provider, model, None))
            .inc_by(wait.as_secs_f64());
    }

    /// Retries counted for `provider`, `model` and `reason` (for tests and
    /// health checks).
    pub fn retries(&self, provider: &str, model: &str, reason: &str) -> u64 {
        self.retries
            .get_or_create(&labels(provider, model, Some(("reason", reason))))
            .get()
    }

    /// Calls counted for `provider`, `model` and `outcome`.
    pub fn requests(&self, provider: &str, model: &str, outcome: &str) -> u64 {
        self.requests
            .get_or_create(&labels(provider, model, Some(("outcome", outcome))))
            .get()
    }
}
