//! The price table: what each provider's models cost, loaded from a JSON file
//! the operator edits, turned into [`Pricing`] (USD micros per million
//! tokens) for the run's cost accounting.
//!
//! File format — prices in USD per million tokens, by provider, then model:
//!
//! ```json
//! {
//!   "anthropic": {
//!     "claude-sonnet-4-5": { "input": 3, "output": 15, "cache_write": 3.75, "cache_read": 0.30 }
//!   },
//!   "openai": { "gpt-4o": { "input": 2.5, "output": 10, "cache_read": 1.25 } }
//! }
//! ```
//!
//! A model is found by its exact name, else as a dated snapshot of a listed
//! name (`claude-sonnet-4-5-20250929` and `gpt-4o-2024-08-06` use
//! `claude-sonnet-4-5` and `gpt-4o`; `-latest` too — but `gpt-4o-mini` is not
//! `gpt-4o`), else by the provider's `"*"` entry. Missing token kinds cost
//! nothing.

use std::collections::BTreeMap;
use std::path::Path;

use glia_proto::{Pricing, Usage};
use serde::Deserialize;

/// One model's prices, USD per million tokens, as written in the file.
#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct UsdPerMillion {
    input: f64,
    output: f64,
    cache_write: f64,
    cache_read: f64,
}

/// Prices by provider and model.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PriceTable {
    prices: BTreeMap<String, BTreeMap<String, Pricing>>,
}

/// The price file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum PriceError {
    /// The file could not be read.
    #[error("reading price file {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The JSON does not have the documented shape.
    #[error("price table is not valid: {0}")]
    Json(#[from] serde_json::Error),
    /// A price is negative, not finite, or absurdly large (over $1,000,000 per million tokens).
    #[error("price of {provider}/{model} {kind} is not a usable number: {value}")]
    BadPrice {
        /// Provider.
        provider: String,
        /// Model.
        model: String,
        /// Token kind.
        kind: &'static str,
        /// The value given.
        value: f64,
    },
}

fn micros(provider: &str, model: &str, kind: &'static str, usd: f64) -> Result<u64, PriceError> {
    if !usd.is_finite() || !(0.0..=1_000_000.0).contains(&usd) {
        return Err(PriceError::BadPrice {
            provider: provider.into(),
            model: model.into(),
            kind,
            value: usd,
        });
    }
    Ok((usd * 1_000_000.0).round() as u64)
}

/// `20250929`, `2024-08-06` or `latest`: what follows a model name in a
/// snapshot name.
fn is_snapshot_suffix(rest: &str) -> bool {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let parts: Vec<&str> = rest.split('-').collect();
    rest == "latest"
        || (digits(rest) && rest.len() >= 6)
        || (parts.len() == 3 && parts[0].len() == 4 && parts.iter().all(|p| digits(p)))
}

impl PriceTable {
    /// Parse the JSON format above.
    ///
    /// Errors: [`PriceError::Json`] for a malformed file or an unknown
    /// field, [`PriceError::BadPrice`] for an unusable number.
    pub fn from_json(json: &str) -> Result<Self, PriceError> {
        let raw: BTreeMap<String, BTreeMap<String, UsdPerMillion>> = serde_json::from_str(json)?;
        let mut prices = BTreeMap::new();
        for (provider, models) in raw {
            let mut table = BTreeMap::new();
            for (model, p) in models {
                let pricing = Pricing {
                    input: micros(&provider, &model, "input", p.input)?,
                    output: micros(&provider, &model, "output", p.output)?,
                    cache_write: micros(&provider, &model, "cache_write", p.cache_write)?,
                    cache_read: micros(&provider, &model, "cache_read", p.cache_read)?,
                };
                table.insert(model, pricing);
            }
            prices.insert(provider, table);
        }
        Ok(PriceTable { prices })
    }

    /// Read and parse a price file.
    ///
    /// Errors: [`PriceError::Io`] when it cannot be read, else as [`PriceTable::from_json`].
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, PriceError> {
        let path = path.as_ref();
        let json = std::fs::read_to_string(path).map_err(|source| PriceError::Io {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_json(&json)
    }

    /// The prices of `provider`'s `model` (see the module docs for the lookup).
    pub fn pricing(&self, provider: &str, model: &str) -> Option<Pricing> {
        let table = self.prices.get(provider)?;
        if let Some(p) = table.get(model) {
            return Some(*p);
        }
        table
            .iter()
            .find(|(name, _)| {
                model
                    .strip_prefix(name.as_str())
                    .and_then(|rest| rest.strip_prefix('-'))
                    .is_some_and(is_snapshot_suffix)
            })
            .map(|(_, p)| *p)
            .or_else(|| table.get("*").copied())
    }

    /// The cost of `usage` on `provider`'s `model` in USD micros (rounded
    /// up), or `None` when the model has no price.
    pub fn cost_usd_micros(&self, provider: &str, model: &str, usage: &Usage) -> Option<u64> {
        self.pricing(provider, model)
            .map(|p| p.cost_usd_micros(usage))
    }
}
