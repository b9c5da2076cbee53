//! Durable timers and waiting for an event: the built-in tools `sleep`,
//! `wait_until` and `wait_for_event` (`docs/waits.md`).
//!
//! A run enables them with [`crate::RunConfig::builtin_tools`]. A call of one
//! is decided as [`crate::Disposition::Wait`] (its `tool.call` records the
//! [`Wait`]: when it started and when it is due) and the run parks at
//! `awaiting_timer` or `awaiting_event` ([`crate::PullPoint`]); no worker
//! holds it. The dispatcher posts a [`crate::Payload::Wake`] when a timer is
//! due, a wait's timeout passes or an event for its key arrives; the worker
//! turns it into the call's `tool.result`.
//!
//! Bad arguments from the model (a negative or too long duration, a time that
//! does not parse, a key out of its charset) are tool errors the model sees
//! ([`parse_wait`]), never a crash.

use chrono::{DateTime, SecondsFormat, TimeZone, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use uuid::Uuid;

/// `sleep {"seconds": N}`: wait N seconds (a number, fractions allowed, 0 to
/// [`MAX_WAIT_MS`] / 1000).
pub const SLEEP: &str = "sleep";
/// `wait_until {"time": "2026-12-07T10:00:00Z"}`: wait until an RFC 3339
/// time (a time already past wakes at once), at most [`MAX_WAIT_MS`] ahead.
pub const WAIT_UNTIL: &str = "wait_until";
/// `wait_for_event {"key": "…", "timeout_seconds": N}`: wait until an event
/// with this key is posted to `POST /v1/events` by the run's tenant, or the
/// timeout passes (default and most [`MAX_WAIT_MS`]).
pub const WAIT_FOR_EVENT: &str = "wait_for_event";
/// Every built-in tool name [`crate::RunConfig::builtin_tools`] accepts.
pub const BUILTIN_TOOLS: [&str; 3] = [SLEEP, WAIT_UNTIL, WAIT_FOR_EVENT];

/// The longest wait, in ms: 366 days.
pub const MAX_WAIT_MS: i64 = 366 * 24 * 3600 * 1000;
/// The longest event key, in bytes.
pub const MAX_EVENT_KEY_LEN: usize = 200;
/// An event key's charset, as a regex: ASCII letters, digits and `. _ : / @ -`,
/// 1 to [`MAX_EVENT_KEY_LEN`] characters.
pub const EVENT_KEY_PATTERN: &str = r"^[A-Za-z0-9._:/@-]{1,200}$";
/// The largest event payload, in bytes of its JSON.
pub const MAX_EVENT_PAYLOAD_BYTES: usize = 64 * 1024;

/// What a waiting call waits for, recorded in its `tool.call`
/// ([`crate::Disposition::Wait`]). Times are Unix ms (UTC).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Wait {
    /// `sleep` or `wait_until`: due at `wake_at_ms`.
    Timer {
        /// When the call was decided (the worker's clock).
        started_at_ms: i64,
        /// When it is due; never before `started_at_ms`.
        wake_at_ms: i64,
    },
    /// `wait_for_event`: an event with `key` of the run's tenant, or the
    /// timeout.
    Event {
        /// The event key.
        key: String,
        /// When the call was decided (the worker's clock).
        started_at_ms: i64,
        /// When the wait gives up with a timeout result.
        timeout_at_ms: i64,
    },
}

impl Wait {
    /// When the wait ends without an event: a timer's wake time, an event
    /// wait's timeout (Unix ms).
    pub fn due_at_ms(&self) -> i64 {
        match self {
            Wait::Timer { wake_at_ms, .. } => *wake_at_ms,
            Wait::Event { timeout_at_ms, .. } => *timeout_at_ms,
        }
    }

    /// The event key, for an event wait.
    pub fn key(&self) -> Option<&str> {
        match self {
            Wait::Event { key, .. } => Some(key),
            Wait::Timer { .. } => None,
        }
    }
}

/// An event posted to `POST /v1/events`, as delivered to a waiting run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ArrivedEvent {
    /// Its id (the caller's idempotency id, or one glia made up).
    pub id: Uuid,
    /// Its key.
    pub key: String,
    /// Its payload, the waiting call's result.
    pub payload: Value,
    /// When the dispatcher received it (Unix ms).
    pub received_at_ms: i64,
}

/// Whether `key` is a valid event key ([`EVENT_KEY_PATTERN`]).
pub fn valid_event_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= MAX_EVENT_KEY_LEN
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._:/@-".contains(&b))
}

fn seconds_ms(input: &Value, field: &str) -> Result<Option<i64>, String> {
    match input.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => {
            let s = n
                .as_f64()
                .ok_or_else(|| format!("{field} must be a number of seconds"))?;
            if !s.is_finite() || s < 0.0 {
                return Err(format!("{field} must be 0 or more seconds, got {n}"));
            }
            let ms = (s * 1000.0).round();
            if ms > MAX_WAIT_MS as f64 {
                return Err(format!(
                    "{field} is {n} seconds; the longest wait is {} seconds (366 days)",
                    MAX_WAIT_MS / 1000
                ));
            }
            Ok(Some(ms as i64))
        }
        Some(_) => Err(format!("{field} must be a number of seconds")),
    }
}

/// The [`Wait`] a call of built-in tool `name` with `input` starts at
/// `now_ms` (Unix ms), or the tool error the model sees: a duration that is
/// negative, not a number or longer than [`MAX_WAIT_MS`]; a time that is not
/// RFC 3339 or further ahead than [`MAX_WAIT_MS`]; a key outside
/// [`EVENT_KEY_PATTERN`]; an unknown field.
pub fn parse_wait(name: &str, input: &Value, now_ms: i64) -> Result<Wait, String> {
    let Some(fields) = input.as_object() else {
        return Err("the arguments must be a JSON object".into());
    };
    let allowed: &[&str] = match name {
        SLEEP => &["seconds"],
        WAIT_UNTIL => &["time"],
        WAIT_FOR_EVENT => &["key", "timeout_seconds"],
        other => return Err(format!("{other:?} is not a built-in wait tool")),
    };
    if let Some(unknown) = fields.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(format!(
            "unknown argument {unknown:?}; {name} takes {}",
            allowed.join(", ")
        ));
    }
    match name {
        SLEEP => {
            let ms = seconds_ms(input, "seconds")?.ok_or("seconds is required")?;
            Ok(Wait::Timer {
                started_at_ms: now_ms,
                wake_at_ms: now_ms.saturating_add(ms),
            })
        }
        WAIT_UNTIL => {
            let text = input
                .get("time")
                .and_then(Value::as_str)
                .ok_or("time is required: an RFC 3339 time such as 2026-12-07T10:00:00Z")?;
            let at = DateTime::parse_from_rfc3339(text)
                .map_err(|e| format!("time {text:?} is not an RFC 3339 time with an offset: {e}"))?
                .timestamp_millis();
            if at - now_ms > MAX_WAIT_MS {
                return Err(format!(
                    "time {text:?} is more than 366 days ahead, the longest wait"
                ));
            }
            Ok(Wait::Timer {
                started_at_ms: now_ms,
                wake_at_ms: at.max(now_ms),
            })
        }
        _ => {
            let key = input
                .get("key")
                .and_then(Value::as_str)
                .ok_or("key is required: a string")?;
            if !valid_event_key(key) {
                return Err(format!(
                    "key {key:?} must be 1 to {MAX_EVENT_KEY_LEN} characters of letters, digits and . _ : / @ -"
                ));
            }
            let ms = seconds_ms(input, "timeout_seconds")?.unwrap_or(MAX_WAIT_MS);
            Ok(Wait::Event {
                key: key.to_owned(),
                started_at_ms: now_ms,
                timeout_at_ms: now_ms.saturating_add(ms),
            })
        }
    }
}

/// RFC 3339 (UTC, ms) of a Unix ms time.
pub fn rfc3339_ms(ms: i64) -> String {
    Utc.timestamp_millis_opt(ms)
        .single()
        .unwrap_or(DateTime::UNIX_EPOCH)
        .to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// The result text of a timer that fired: `{"woke_at": "…", "due_at": "…"}`.
pub fn timer_result(wait_due_ms: i64, woke_at_ms: i64) -> String {
    json!({"due_at": rfc3339_ms(wait_due_ms), "woke_at": rfc3339_ms(woke_at_ms)}).to_string()
}

/// The result text of an event wait that timed out:
/// `{"timed_out": true, "key": "…", "waited_until": "…"}`.
pub fn timeout_result(key: &str, timeout_at_ms: i64) -> String {
    json!({"timed_out": true, "key": key, "waited_until": rfc3339_ms(timeout_at_ms)}).to_string()
}

/// The result text of an event wait that got its event:
/// `{"key": "…", "event_id": "…", "received_at": "…", "payload": …}`.
pub fn event_result(event: &ArrivedEvent) -> String {
    json!({
        "key": event.key,
        "event_id": event.id,
        "received_at": rfc3339_ms(event.received_at_ms),
        "payload": event.payload,
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_bounds_arguments() {
        let now = 1_765_000_000_000;
        assert_eq!(
            parse_wait(SLEEP, &json!({"seconds": 2.5}), now),
            Ok(Wait::Timer {
                started_at_ms: now,
                wake_at_ms: now + 2500
            })
        );
        assert!(parse_wait(SLEEP, &json!({"seconds": -1}), now).is_err());
        assert!(parse_wait(SLEEP, &json!({"seconds": "1"}), now).is_err());
        assert!(
            parse_wait(SLEEP, &json!({"seconds": 1e12}), now)
                .unwrap_err()
                .contains("366 days")
        );
        assert!(
            parse_wait(SLEEP, &json!({"seconds": 1, "x": 1}), now)
                .unwrap_err()
                .contains("unknown argument")
        );
        let past = parse_wait(WAIT_UNTIL, &json!({"time": "2000-01-01T00:00:00Z"}), now).unwrap();
        assert_eq!(past.due_at_ms(), now, "a time past wakes at once");
        assert!(parse_wait(WAIT_UNTIL, &json!({"time": "tomorrow"}), now).is_err());
        assert!(parse_wait(WAIT_UNTIL, &json!({"time": "2999-01-01T00:00:00Z"}), now).is_err());
        let e = parse_wait(WAIT_FOR_EVENT, &json!({"key": "order/42:signed"}), now).unwrap();
        assert_eq!(e.key(), Some("order/42:signed"));
        assert_eq!(e.due_at_ms(), now + MAX_WAIT_MS);
        assert!(parse_wait(WAIT_FOR_EVENT, &json!({"key": "a b"}), now).is_err());
        assert!(parse_wait(WAIT_FOR_EVENT, &json!({"key": "k".repeat(201)}), now).is_err());
        assert!(parse_wait(WAIT_FOR_EVENT, &json!({"key": ""}), now).is_err());
    }
}
