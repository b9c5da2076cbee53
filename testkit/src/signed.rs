//! Checking a signed request in a test's receiver: Standard Webhooks
//! (<https://www.standardwebhooks.com/>), as glia's webhooks and HTTP hooks
//! sign them ([`glia_proto::webhook_signature`]).

use axum::http::HeaderMap;

/// The request's `webhook-id` when its `webhook-signature` matches `body`
/// under `secret` and its `webhook-timestamp` is within five minutes of
/// now; `None` otherwise.
pub fn verified(secret: &str, headers: &HeaderMap, body: &[u8]) -> Option<String> {
    let header = |n: &str| headers.get(n).and_then(|v| v.to_str().ok());
    let id = header(glia_proto::webhook_signature::ID_HEADER)?;
    let timestamp = header(glia_proto::webhook_signature::TIMESTAMP_HEADER)?
        .parse()
        .ok()?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?
        .as_secs();
    glia_proto::webhook_signature::verify(
        secret,
        id,
        timestamp,
        body,
        header(glia_proto::webhook_signature::SIGNATURE_HEADER)?,
        i64::try_from(now).ok()?,
        300,
    )
    .ok()?;
    Some(id.to_owned())
}
