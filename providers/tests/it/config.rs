use glia_agent::provider::Provider;
use glia_proto::provider::{ProviderKind, UnknownProviderKind};
use glia_providers::http::{HttpProvider, RetryPolicy, http_client};
use glia_providers::{
    Anthropic, ApiKey, ConfigError, ProviderConfig, anthropic_provider, from_config,
};

use crate::common::{Reply, Server, request};

const SECRET: &str = "sk-ant-api03-SECRET-abcdefghijklmnop";

#[test]
fn a_missing_key_is_a_clear_error() {
    let mut config = ProviderConfig::new(ProviderKind::Anthropic);
    config.api_key_env = Some("GLIA_TEST_KEY_THAT_IS_NOT_SET".into());
    let e = from_config(&config).err().expect("no key, no provider");
    assert_eq!(
        e,
        ConfigError::MissingKey {
            var: "GLIA_TEST_KEY_THAT_IS_NOT_SET".into(),
            kind: "anthropic"
        }
    );
    assert_eq!(
        e.to_string(),
        "no API key for the anthropic provider: set the environment variable GLIA_TEST_KEY_THAT_IS_NOT_SET (or name another variable with api_key_env / --api-key-env)"
    );
    config.allow_missing_key = true;
    assert!(
        from_config(&config).is_ok(),
        "keyless local servers are allowed when asked for"
    );
}

#[test]
fn kinds_and_urls() {
    assert_eq!(
        "vllm".parse::<ProviderKind>().unwrap(),
        ProviderKind::Openai
    );
    assert_eq!(
        "Anthropic".parse::<ProviderKind>().unwrap(),
        ProviderKind::Anthropic
    );
    assert!(matches!(
        "gemini".parse::<ProviderKind>(),
        Err(UnknownProviderKind(_))
    ));
    let mut config = ProviderConfig::new(ProviderKind::Openai);
    config.allow_missing_key = true;
    config.base_url = Some("ftp://example.invalid".into());
    assert!(matches!(
        from_config(&config),
        Err(ConfigError::BadUrl { .. })
    ));
    config.base_url = Some("http://127.0.0.1:8000/v1/".into());
    assert_eq!(
        glia_providers::openai_provider(&config).unwrap().url(),
        "http://127.0.0.1:8000/v1/chat/completions"
    );
    let config: ProviderConfig =
        serde_json::from_str(r#"{"kind": "anthropic", "base_url": "http://127.0.0.1:9"}"#).unwrap();
    assert_eq!(config.key_env(), "ANTHROPIC_API_KEY");
}

#[tokio::test]
async fn the_key_is_read_from_the_named_variable_and_never_shown() {
    // SAFETY of the test: a variable name no other test uses.
    unsafe { std::env::set_var("GLIA_TEST_KEY_CONFIG_SECRET", SECRET) };
    // The server echoes the key back in its error, as a careless proxy might.
    let body = format!(
        r#"{{"type":"error","error":{{"type":"authentication_error","message":"invalid x-api-key {SECRET}"}}}}"#
    );
    let server = Server::replay(vec![Reply::json(401, body.into_bytes())]).await;
    let mut config = ProviderConfig::new(ProviderKind::Anthropic);
    config.api_key_env = Some("GLIA_TEST_KEY_CONFIG_SECRET".into());
    config.base_url = Some(server.base.clone());
    let provider = anthropic_provider(&config).unwrap();
    assert!(!format!("{provider:?}").contains(SECRET));
    assert!(format!("{provider:?}").contains("ApiKey(***)"));
    let e = provider
        .generate(&request("claude-sonnet-4-5"), &|_| {})
        .await
        .unwrap_err();
    assert!(!e.to_string().contains(SECRET), "{e}");
    assert!(!format!("{e:?}").contains(SECRET), "{e:?}");
    assert!(e.to_string().contains("[redacted]"));
    assert_eq!(
        server.seen()[0].header("x-api-key"),
        Some(SECRET),
        "the key did go in the header"
    );
    assert_eq!(format!("{}", ApiKey::new(SECRET)), "ApiKey(***)");
    assert!(
        !format!("{:?}", config).contains(SECRET),
        "the config names the variable, not the key"
    );
}

#[tokio::test]
async fn model_override() {
    let server = Server::replay(vec![Reply::sse(crate::common::fixture(
        "anthropic/refusal.sse",
    ))])
    .await;
    let p = HttpProvider::new(
        Anthropic::default(),
        http_client().unwrap(),
        &server.base,
        None,
    )
    .with_model("claude-opus-4-1")
    .with_retry(RetryPolicy {
        max_retries: 0,
        ..RetryPolicy::default()
    });
    p.call(&request("scripted"), &|_| {}).await.unwrap();
    assert_eq!(server.seen()[0].body["model"], "claude-opus-4-1");
}
