//! Standard Webhooks signatures: the one implementation glia signs with,
//! shared by the dispatcher's webhooks (`glia_dispatcher::webhooks`) and the
//! worker's HTTP hooks (`glia_agent::http_hooks`).
//!
//! Specification: <https://www.standardwebhooks.com/> (the "Signature
//! scheme" section). A request carries three headers:
//!
//! | header | value |
//! |---|---|
//! | `webhook-id` | the message id: the same on every retry of one message, so a receiver can dedupe |
//! | `webhook-timestamp` | Unix seconds when this attempt was signed |
//! | `webhook-signature` | `v1,` + base64(HMAC-SHA256(key, `"{id}.{timestamp}.{body}"`)), space-separated when there are several |
//!
//! The key is the base64 part of a `whsec_…` secret (a secret without the
//! prefix is read as base64 all the same). Pure: no I/O; the secret is only
//! read, never kept or printed.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The header names of the scheme.
pub const ID_HEADER: &str = "webhook-id";
/// See [`ID_HEADER`].
pub const TIMESTAMP_HEADER: &str = "webhook-timestamp";
/// See [`ID_HEADER`].
pub const SIGNATURE_HEADER: &str = "webhook-signature";

/// Why a secret or a signature is unusable. Never holds the secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    /// The secret's key part is not base64 (or is empty).
    #[error("the signing secret is not whsec_ followed by base64: {0}")]
    Secret(String),
    /// No `v1` signature of the header matches the body.
    #[error("no signature matches")]
    Mismatch,
    /// The timestamp is further than the tolerance from now.
    #[error("the timestamp is {0} s away from now, outside the tolerance")]
    Stale(i64),
}

/// The HMAC key of `secret` (`whsec_` + base64). Errors: not base64, or empty.
fn key(secret: &str) -> Result<Vec<u8>, SignatureError> {
    let key = B64
        .decode(secret.strip_prefix("whsec_").unwrap_or(secret))
        .map_err(|e| SignatureError::Secret(e.to_string()))?;
    if key.is_empty() {
        return Err(SignatureError::Secret("the key is empty".into()));
    }
    Ok(key)
}

/// Whether `secret` is usable for signing (`whsec_` + non-empty base64).
pub fn check_secret(secret: &str) -> Result<(), SignatureError> {
    key(secret).map(|_| ())
}

fn mac(
    secret: &str,
    id: &str,
    timestamp: i64,
    body: &[u8],
) -> Result<Hmac<Sha256>, SignatureError> {
    let mut mac = Hmac::<Sha256>::new_from_slice(&key(secret)?)
        .map_err(|e| SignatureError::Secret(e.to_string()))?;
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    Ok(mac)
}

/// `webhook-signature` for `body` sent as message `id` at `timestamp` (Unix
/// seconds): `v1,<base64 HMAC-SHA256>`.
///
/// ```
/// // The example of the specification's reference libraries.
/// let sig = glia_proto::webhook_signature::sign(
///     "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "msg_p5jXN8AQM9LWM0D4loKWxJek",
///     1614265330, br#"{"test": 2432232314}"#).unwrap();
/// assert_eq!(sig, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
/// ```
pub fn sign(secret: &str, id: &str, timestamp: i64, body: &[u8]) -> Result<String, SignatureError> {
    let mac = mac(secret, id, timestamp, body)?;
    Ok(format!("v1,{}", B64.encode(mac.finalize().into_bytes())))
}

/// Check a received message: some `v1,` signature of the space-separated
/// `signatures` header matches (compared in constant time), and
/// `timestamp` is within `tolerance_s` seconds of `now` (Unix seconds; the
/// specification suggests 300).
pub fn verify(
    secret: &str,
    id: &str,
    timestamp: i64,
    body: &[u8],
    signatures: &str,
    now: i64,
    tolerance_s: i64,
) -> Result<(), SignatureError> {
    let skew = (now - timestamp).abs();
    if skew > tolerance_s {
        return Err(SignatureError::Stale(skew));
    }
    for sig in signatures.split(' ') {
        let Some(b64) = sig.strip_prefix("v1,") else {
            continue;
        };
        let Ok(given) = B64.decode(b64) else {
            continue;
        };
        if mac(secret, id, timestamp, body)?
            .verify_slice(&given)
            .is_ok()
        {
            return Ok(());
        }
    }
    Err(SignatureError::Mismatch)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

    #[test]
    fn signs_and_verifies_the_reference_example() {
        let body = br#"{"test": 2432232314}"#;
        let id = "msg_p5jXN8AQM9LWM0D4loKWxJek";
        let sig = sign(SECRET, id, 1614265330, body).unwrap();
        assert_eq!(sig, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
        let both = format!("v1,bm90IGl0 {sig}");
        verify(SECRET, id, 1614265330, body, &both, 1614265330, 300).unwrap();
        assert_eq!(
            verify(SECRET, id, 1614265330, b"{}", &sig, 1614265330, 300),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            verify(SECRET, id, 1614265330, body, &sig, 1614265330 + 301, 300),
            Err(SignatureError::Stale(301))
        );
    }

    #[test]
    fn bad_secrets_are_named_without_their_value() {
        let e = check_secret("whsec_not base64!").unwrap_err();
        assert!(!e.to_string().contains("not base64!"), "{e}");
        assert!(check_secret("whsec_").is_err());
        assert!(check_secret(SECRET).is_ok());
    }
}
