//! Why one HTTP model call failed, classified once for both wire formats.
//!
//! [`CallError`] is richer than the worker's [`ProviderError`]: it keeps the
//! HTTP status, the provider's error type, the `retry-after` hint and whether
//! the provider told us to retry. The retry loop reads it; at the provider
//! boundary it is converted with `From<CallError> for ProviderError`.
//!
//! Classification follows the providers' error references: Anthropic's
//! "Errors" page (400 `invalid_request_error`, 401 `authentication_error`,
//! 402 `billing_error`, 403 `permission_error`, 404 `not_found_error`, 413
//! `request_too_large`, 429 `rate_limit_error`, 500 `api_error`, 529
//! `overloaded_error`) and OpenAI's "Error codes" page (429 with code
//! `insufficient_quota` is a spending cap, not a rate limit).

use std::time::Duration;

use glia_proto::provider::ProviderError;
use reqwest::header::HeaderMap;

/// One failed model call.
///
/// Messages never contain the API key: every message built from a server
/// response or a transport error passes through [`crate::config::ApiKey::redact`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    /// The request was rejected as malformed or too large (400, 404, 413,
    /// 422, other 4xx). Not retried.
    #[error("invalid request (HTTP {status}): {message}")]
    InvalidRequest {
        /// HTTP status.
        status: u16,
        /// The provider's message.
        message: String,
    },
    /// The key is missing, wrong, or lacks permission (401, 403). Not retried.
    #[error("authentication failed (HTTP {status}): {message}")]
    Auth {
        /// HTTP status.
        status: u16,
        /// The provider's message.
        message: String,
    },
    /// Rate limited (429). Retried after `retry_after` (or backoff).
    #[error("rate limited: {message}")]
    RateLimited {
        /// The provider's wait hint, when it gave one.
        retry_after: Option<Duration>,
        /// The provider's message.
        message: String,
    },
    /// The provider is overloaded (529, 503, or an `overloaded_error`
    /// event in a stream). Retried.
    #[error("provider overloaded (HTTP {status}): {message}")]
    Overloaded {
        /// HTTP status (200 for an error event inside a stream).
        status: u16,
        /// The provider's wait hint.
        retry_after: Option<Duration>,
        /// The provider's message.
        message: String,
    },
    /// A server error (5xx, 408, 409, or `api_error` in a stream). Retried.
    #[error("provider error (HTTP {status}): {message}")]
    Server {
        /// HTTP status (200 for an error event inside a stream).
        status: u16,
        /// The provider's wait hint.
        retry_after: Option<Duration>,
        /// The provider's message.
        message: String,
    },
    /// The account's spending cap or quota is reached (402, `billing_error`,
    /// `insufficient_quota`, or a 429 the provider marks as not retryable).
    /// Not retried: the run is parked as paused.
    #[error("spending cap reached: {message}")]
    SpendCap {
        /// The provider's message.
        message: String,
    },
    /// Connecting, sending or reading failed, or timed out. Retried.
    #[error("network error: {message}")]
    Network {
        /// What failed.
        message: String,
    },
    /// The stream ended before the provider said the turn was complete
    /// (no `message_stop` / no finish reason). Retried; never recorded as
    /// a complete turn.
    #[error("stream cut off before completion: {message}")]
    StreamCut {
        /// Where it stopped.
        message: String,
    },
    /// The answer's stream breaks its own grammar in a way glia cannot map
    /// exactly (see the grammar tables in [`crate::anthropic`] and
    /// [`crate::openai`]): a delta for a block that never started, a block
    /// started twice, a tool call renamed mid-stream, arguments that can be
    /// read more than one way, an unsupported block type, a missing stop
    /// reason. Retried like a transient failure (a new attempt usually
    /// streams cleanly); when retries run out the run fails with this
    /// reason ([`ProviderError::Malformed`]). Nothing is dropped, merged or
    /// overwritten to make an answer fit.
    #[error("malformed answer: {message}")]
    Malformed {
        /// What could not be mapped, and where.
        message: String,
    },
    /// The provider answered with something that is not its documented
    /// format (bad JSON, an event out of order). Not retried.
    #[error("invalid response from provider: {message}")]
    InvalidResponse {
        /// What was wrong.
        message: String,
    },
    /// The local rate limiter or retry budget gave up waiting; the run should
    /// be retried later (the job is re-queued, no worker waits).
    #[error("rate limit wait of {} ms exceeds this call's budget", wait.as_millis())]
    WaitTooLong {
        /// How long the call would still have to wait.
        wait: Duration,
    },
}

impl CallError {
    /// True when the same request may succeed if sent again.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            CallError::RateLimited { .. }
                | CallError::Overloaded { .. }
                | CallError::Server { .. }
                | CallError::Network { .. }
                | CallError::StreamCut { .. }
                | CallError::Malformed { .. }
        )
    }

    /// The provider's wait hint, if any.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            CallError::RateLimited { retry_after, .. }
            | CallError::Overloaded { retry_after, .. }
            | CallError::Server { retry_after, .. } => *retry_after,
            CallError::WaitTooLong { wait } => Some(*wait),
            _ => None,
        }
    }

    /// A short, stable label for metrics and retry events: `rate_limited`,
    /// `overloaded`, `server`, `network`, `stream_cut`, `invalid_request`,
    /// `auth`, `spend_cap`, `malformed_answer`, `invalid_response`,
    /// `wait_too_long`.
    pub fn kind(&self) -> &'static str {
        match self {
            CallError::InvalidRequest { .. } => "invalid_request",
            CallError::Auth { .. } => "auth",
            CallError::RateLimited { .. } => "rate_limited",
            CallError::Overloaded { .. } => "overloaded",
            CallError::Server { .. } => "server",
            CallError::SpendCap { .. } => "spend_cap",
            CallError::Network { .. } => "network",
            CallError::StreamCut { .. } => "stream_cut",
            CallError::Malformed { .. } => "malformed_answer",
            CallError::InvalidResponse { .. } => "invalid_response",
            CallError::WaitTooLong { .. } => "wait_too_long",
        }
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl From<CallError> for ProviderError {
    /// Rate limits keep their wait (in ms; 1 s when the provider gave
    /// none); spending caps become [`ProviderError::SpendCap`]; a rejected
    /// key [`ProviderError::Auth`] (both pause the run); a malformed answer
    /// that survived its retries [`ProviderError::Malformed`] (the run
    /// fails with the reason); other retryable
    /// failures [`ProviderError::Transient`] with the provider's wait hint;
    /// the rest [`ProviderError::InvalidRequest`] (the run fails with the
    /// message).
    fn from(e: CallError) -> Self {
        match e {
            CallError::RateLimited { retry_after, .. } => ProviderError::RateLimited {
                retry_after_ms: retry_after.map_or(1000, millis),
            },
            CallError::WaitTooLong { wait } => ProviderError::RateLimited {
                retry_after_ms: millis(wait),
            },
            CallError::SpendCap { message } => ProviderError::SpendCap(message),
            CallError::Auth { status, message } => {
                ProviderError::Auth(format!("HTTP {status}: {message}"))
            }
            CallError::Malformed { message } => ProviderError::Malformed(message),
            e if e.is_retryable() => ProviderError::Transient {
                retry_after_ms: e.retry_after().map(millis),
                message: e.to_string(),
            },
            e => ProviderError::InvalidRequest(e.to_string()),
        }
    }
}

/// The wait a response asks for, read from its headers: `retry-after-ms`
/// (milliseconds, may be fractional) first, then `retry-after` as seconds
/// (may be fractional) or as an HTTP date (RFC 9110 §10.2.3), relative to
/// `now_ms` (Unix milliseconds). A date in the past gives zero; an
/// unreadable value gives `None`.
pub fn retry_after(headers: &HeaderMap, now_ms: u64) -> Option<Duration> {
    let get = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    if let Some(ms) = get("retry-after-ms")
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|v| v.is_finite() && *v >= 0.0)
    {
        return Some(Duration::from_micros((ms * 1000.0) as u64));
    }
    let value = get("retry-after")?;
    if let Ok(secs) = value.parse::<f64>() {
        return (secs.is_finite() && secs >= 0.0)
            .then(|| Duration::from_millis((secs * 1000.0) as u64));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    let at_ms = u64::try_from(at.duration_since(std::time::UNIX_EPOCH).ok()?.as_millis()).ok()?;
    Some(Duration::from_millis(at_ms.saturating_sub(now_ms)))
}

/// The provider's `x-should-retry` header (`true` / `false`), if present.
pub fn should_retry(headers: &HeaderMap) -> Option<bool> {
    match headers
        .get("x-should-retry")
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
    {
        Some("true") => Some(true),
        Some("false") => Some(false),
        _ => None,
    }
}

/// What a provider said about one failure, before classification.
#[derive(Debug, Clone, Default)]
pub(crate) struct Failure {
    /// HTTP status; 200 for an error inside a stream.
    pub status: u16,
    /// The provider's error type (`rate_limit_error`, `insufficient_quota` …).
    pub error_type: Option<String>,
    /// The provider's error code, when separate from the type (OpenAI).
    pub code: Option<String>,
    /// The provider's message (already redacted).
    pub message: String,
    /// `retry-after` / `retry-after-ms`.
    pub retry_after: Option<Duration>,
    /// `x-should-retry`.
    pub should_retry: Option<bool>,
}

impl Failure {
    fn names(&self, wanted: &[&str]) -> bool {
        [&self.error_type, &self.code]
            .into_iter()
            .flatten()
            .any(|n| wanted.contains(&n.as_str()))
    }

    /// Classify: spending caps first (whatever the status), then the status
    /// and the error type; `x-should-retry` overrides retryability.
    pub fn classify(self) -> CallError {
        let Failure {
            status,
            message,
            retry_after,
            should_retry,
            ..
        } = self.clone();
        if status == 402
            || self.names(&[
                "billing_error",
                "insufficient_quota",
                "billing_hard_limit_reached",
            ])
            || (status == 429 && should_retry == Some(false))
        {
            return CallError::SpendCap { message };
        }
        let classified =
            if status == 429 || self.names(&["rate_limit_error", "rate_limit_exceeded"]) {
                CallError::RateLimited {
                    retry_after,
                    message,
                }
            } else if status == 529 || status == 503 || self.names(&["overloaded_error"]) {
                CallError::Overloaded {
                    status,
                    retry_after,
                    message,
                }
            } else if status >= 500
                || status == 408
                || status == 409
                || self.names(&["api_error", "server_error", "timeout_error"])
            {
                CallError::Server {
                    status,
                    retry_after,
                    message,
                }
            } else if status == 401
                || status == 403
                || self.names(&["authentication_error", "permission_error"])
            {
                CallError::Auth { status, message }
            } else {
                CallError::InvalidRequest { status, message }
            };
        match (should_retry, classified.is_retryable()) {
            (Some(false), true) => CallError::InvalidRequest {
                status,
                message: classified.to_string(),
            },
            (Some(true), false) if !matches!(classified, CallError::Auth { .. }) => {
                CallError::Server {
                    status,
                    retry_after,
                    message: classified.to_string(),
                }
            }
            _ => classified,
        }
    }
}
