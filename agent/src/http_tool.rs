//! HTTP tools ([`glia_proto::HttpTool`]): a call is a JSON POST of its
//! arguments to the tool's URL, whose origin the operator's catalogue
//! allows, with `Idempotency-Key: {run_id}:{turn}:{call_id}`.
//!
//! - The answer must be a 2xx whose body is JSON, at most
//!   `max_response_bytes` (checked as it streams, so a larger body is never
//!   held); it is the result the model sees, as is.
//! - A non-2xx answer is a tool error with the status and the body's first
//!   500 characters; a body that is not JSON is an `invalid_output` error.
//! - Only an idempotent tool is retried (backon, exponential from 200 ms to
//!   5 s, at most 4 retries), on a transport error, 408, 429 or 5xx, with the
//!   same idempotency key; every attempt fits in the tool's `timeout_ms`.
//! - Redirects are not followed: a redirect could leave the allowed origin.

use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use futures::StreamExt;
use glia_proto::ToolErrorKind;
use serde_json::Value;

use crate::tool::ToolFailure;

/// One call of an HTTP tool.
#[derive(Debug, Clone)]
pub struct HttpCall<'a> {
    /// The tool's name, for messages.
    pub tool: &'a str,
    /// Where to POST.
    pub url: &'a str,
    /// The arguments (the body).
    pub input: &'a Value,
    /// Sent as `Idempotency-Key`.
    pub idempotency_key: &'a str,
    /// Retry transient failures.
    pub idempotent: bool,
    /// Time for the whole call, retries included.
    pub timeout: Duration,
    /// Largest accepted body, in bytes.
    pub max_response_bytes: u64,
}

/// The HTTP client of HTTP tools (one per worker: its connection pool).
#[derive(Debug, Clone)]
pub struct HttpTools {
    client: reqwest::Client,
}

impl Default for HttpTools {
    fn default() -> Self {
        HttpTools::new()
    }
}

/// A failed attempt, and whether trying again may help.
struct Attempt {
    failure: ToolFailure,
    transient: bool,
}

impl HttpTools {
    /// A client that follows no redirects.
    pub fn new() -> HttpTools {
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("glia-worker/", env!("CARGO_PKG_VERSION")))
            .build()
            .expect("an HTTP client with rustls builds");
        HttpTools { client }
    }

    /// Run one call (see the module doc). Errors: the [`ToolFailure`] the
    /// model sees.
    pub async fn call(&self, call: HttpCall<'_>) -> Result<String, ToolFailure> {
        let attempt = || self.attempt(&call);
        let retries = if call.idempotent { 4 } else { 0 };
        let policy = ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(200))
            .with_max_delay(Duration::from_secs(5))
            .with_max_times(retries);
        let work = attempt.retry(policy).when(|a: &Attempt| a.transient).notify(|a: &Attempt, wait: Duration| {
            tracing::warn!(tool = call.tool, error = %a.failure.message, wait_ms = wait.as_millis() as u64, "HTTP tool call failed; retrying");
        });
        match tokio::time::timeout(call.timeout, work).await {
            Ok(Ok(text)) => Ok(text),
            Ok(Err(a)) => Err(a.failure),
            Err(_) => Err(ToolFailure {
                kind: ToolErrorKind::Timeout,
                message: format!(
                    "HTTP tool {} timed out after {} ms",
                    call.tool,
                    call.timeout.as_millis()
                ),
            }),
        }
    }

    async fn attempt(&self, call: &HttpCall<'_>) -> Result<String, Attempt> {
        let tool = call.tool;
        let sent = self
            .client
            .post(call.url)
            .header("Idempotency-Key", call.idempotency_key)
            .json(call.input)
            .send()
            .await;
        let response = sent.map_err(|e| Attempt {
            failure: ToolFailure {
                kind: ToolErrorKind::Unavailable,
                message: format!("HTTP tool {tool}: the request failed: {}", without_url(&e)),
            },
            transient: true,
        })?;
        let status = response.status();
        if response
            .content_length()
            .is_some_and(|n| n > call.max_response_bytes)
        {
            return Err(too_large(tool, call.max_response_bytes));
        }
        let mut body = Vec::new();
        let mut stream = response.bytes_stream();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| Attempt {
                failure: ToolFailure {
                    kind: ToolErrorKind::Unavailable,
                    message: format!(
                        "HTTP tool {tool}: the answer was cut off: {}",
                        without_url(&e)
                    ),
                },
                transient: true,
            })?;
            if (body.len() + chunk.len()) as u64 > call.max_response_bytes {
                return Err(too_large(tool, call.max_response_bytes));
            }
            body.extend_from_slice(&chunk);
        }
        let text = String::from_utf8_lossy(&body);
        if !status.is_success() {
            let transient =
                status.is_server_error() || status.as_u16() == 429 || status.as_u16() == 408;
            let excerpt: String = text.chars().take(500).collect();
            return Err(Attempt {
                failure: ToolFailure::failed(format!(
                    "HTTP tool {tool} answered {status}: {excerpt}"
                )),
                transient,
            });
        }
        if let Err(e) = serde_json::from_slice::<serde::de::IgnoredAny>(&body) {
            return Err(Attempt {
                failure: ToolFailure {
                    kind: ToolErrorKind::InvalidOutput,
                    message: format!(
                        "HTTP tool {tool} answered {status} with a body that is not JSON ({e})"
                    ),
                },
                transient: false,
            });
        }
        Ok(text.into_owned())
    }
}

fn too_large(tool: &str, max: u64) -> Attempt {
    Attempt {
        failure: ToolFailure {
            kind: ToolErrorKind::InvalidOutput,
            message: format!("HTTP tool {tool} answered with more than {max} bytes"),
        },
        transient: false,
    }
}

/// A reqwest error's text with its causes.
fn without_url(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}
