use glia_proto::{Pricing, Usage};
use glia_providers::pricing::{PriceError, PriceTable};

const TABLE: &str = r#"{
  "anthropic": {
    "claude-sonnet-4-5": {"input": 3, "output": 15, "cache_write": 3.75, "cache_read": 0.30},
    "claude-sonnet-4": {"input": 99, "output": 99},
    "*": {"input": 1, "output": 1}
  },
  "openai": {"gpt-4o": {"input": 2.5, "output": 10, "cache_read": 1.25}}
}"#;

#[test]
fn prices_are_usd_micros_per_million_tokens() {
    let t = PriceTable::from_json(TABLE).unwrap();
    assert_eq!(
        t.pricing("anthropic", "claude-sonnet-4-5"),
        Some(Pricing {
            input: 3_000_000,
            output: 15_000_000,
            cache_write: 3_750_000,
            cache_read: 300_000
        })
    );
    // A dated snapshot uses the name it extends.
    assert_eq!(
        t.pricing("anthropic", "claude-sonnet-4-5-20250929")
            .unwrap()
            .cache_read,
        300_000
    );
    assert_eq!(
        t.pricing("openai", "gpt-4o-2024-08-06").unwrap().input,
        2_500_000
    );
    assert_eq!(
        t.pricing("anthropic", "claude-haiku-4-5").unwrap().input,
        1_000_000,
        "the provider's * entry"
    );
    assert_eq!(
        t.pricing("openai", "gpt-4o-mini"),
        None,
        "gpt-4o-mini is another model, not a gpt-4o snapshot"
    );
}

#[test]
fn cost_counts_every_token_kind_rounded_up() {
    let t = PriceTable::from_json(TABLE).unwrap();
    // The anthropic/tools.sse answer: 472 input, 61 output, 1830 cache write.
    let u = Usage {
        input_tokens: 472,
        output_tokens: 61,
        cache_write_tokens: 1830,
        cache_read_tokens: 0,
        estimated: false,
    };
    // 472×3 + 61×15 + 1830×3.75 = 1416 + 915 + 6862.5 micros → 9194.
    assert_eq!(
        t.cost_usd_micros("anthropic", "claude-sonnet-4-5", &u),
        Some(9194)
    );
    // The openai/tools.sse answer: 510 uncached input, 61 output, 1792 cached.
    let u = Usage {
        input_tokens: 510,
        output_tokens: 61,
        cache_write_tokens: 0,
        cache_read_tokens: 1792,
        estimated: false,
    };
    // 510×2.5 + 61×10 + 1792×1.25 = 1275 + 610 + 2240.
    assert_eq!(t.cost_usd_micros("openai", "gpt-4o", &u), Some(4125));
    assert_eq!(t.cost_usd_micros("openai", "o3", &u), None);
}

#[test]
fn bad_tables_are_refused() {
    assert!(matches!(
        PriceTable::from_json(r#"{"openai": {"m": {"input": -1}}}"#),
        Err(PriceError::BadPrice { kind: "input", .. })
    ));
    assert!(matches!(
        PriceTable::from_json(r#"{"openai": {"m": {"inptu": 1}}}"#),
        Err(PriceError::Json(_))
    ));
    assert!(matches!(
        PriceTable::from_file("/nonexistent/prices.json"),
        Err(PriceError::Io { .. })
    ));
}

#[test]
fn the_shipped_example_file_loads() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/prices.example.json");
    let t = PriceTable::from_file(path).unwrap();
    assert!(t.pricing("anthropic", "claude-sonnet-4-5").is_some());
    assert!(t.pricing("openai", "gpt-4o").is_some());
}

#[test]
fn a_provider_prices_runs_from_its_table() {
    use std::sync::Arc;

    use glia_agent::provider::Provider;
    use glia_providers::http::{HttpProvider, http_client};
    use glia_providers::{Anthropic, RefusalIsolator};

    let table =
        PriceTable::from_file(concat!(env!("CARGO_MANIFEST_DIR"), "/prices.example.json")).unwrap();
    let http = HttpProvider::new(
        Anthropic::default(),
        http_client().unwrap(),
        "http://127.0.0.1:9",
        None,
    );
    assert_eq!(
        http.pricing("claude-sonnet-4-5"),
        None,
        "no table, no price"
    );
    let http = http.with_prices(table.clone());
    assert_eq!(
        http.pricing("claude-sonnet-4-5"),
        table.pricing("anthropic", "claude-sonnet-4-5")
    );
    assert_eq!(http.pricing("gpt-4o"), None, "another provider's model");
    // The configured model override is what gets priced.
    let pinned = HttpProvider::new(
        Anthropic::default(),
        http_client().unwrap(),
        "http://127.0.0.1:9",
        None,
    )
    .with_prices(table.clone())
    .with_model("claude-opus-4-1");
    assert_eq!(
        pinned.pricing("claude-sonnet-4-5"),
        table.pricing("anthropic", "claude-opus-4-1")
    );
    // The refusal isolator asks the provider it wraps.
    let wrapped = RefusalIsolator::new(Arc::new(http));
    assert_eq!(
        wrapped.pricing("claude-haiku-4-5").unwrap().input,
        1_000_000
    );
}
