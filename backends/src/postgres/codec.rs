//! What [`super::PgLog`] and its [`group`](super::group) committer share:
//! the error mapping of Postgres failures, row decoding helpers, and the
//! columns a commit writes (a state's summary, a batch of encoded events).
//! It uses nothing of its parent, so both can use it.

use chrono::{DateTime, Utc};
use glia_proto::{Event, Phase, RunState};
use serde_json::Value;
use sha2::{Digest, Sha256};
use tokio_postgres::Row;
use tokio_postgres::types::FromSql;
use uuid::Uuid;

use crate::{LogError, RunStatus};

pub(super) fn describe(e: &tokio_postgres::Error) -> String {
    match e.code() {
        Some(code) => format!("{e} (SQLSTATE {})", code.code()),
        None => e.to_string(),
    }
}

pub(crate) fn unavailable(what: &str, e: &tokio_postgres::Error) -> LogError {
    LogError::Unavailable(format!("{what}: {}", describe(e)))
}

/// A failed write: values Postgres refuses (class 22, data exceptions) are the
/// caller's; anything else is the store's.
pub(super) fn write_error(run_id: Uuid, what: &str, e: &tokio_postgres::Error) -> LogError {
    match e.code() {
        Some(code) if code.code().starts_with("22") => LogError::Invalid {
            run_id,
            reason: format!("{what}: {}", describe(e)),
        },
        _ => unavailable(what, e),
    }
}

pub(crate) fn corrupt(what: String) -> LogError {
    LogError::Corrupt(what)
}

pub(crate) fn col<'a, T: FromSql<'a>>(row: &'a Row, name: &str) -> Result<T, LogError> {
    row.try_get(name)
        .map_err(|e| corrupt(format!("column {name}: {e}")))
}

pub(super) fn seq_of(value: i64, what: &str) -> Result<u64, LogError> {
    u64::try_from(value).map_err(|_| corrupt(format!("{what} is negative ({value})")))
}

/// A `u64` sequence as a SQL bound (sequences above `i64::MAX` do not exist).
pub(super) fn sql_seq(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// True when serialised JSON holds an escaped U+0000 (or a literal `\u0000`,
/// which is harmless to treat alike).
pub(super) fn has_nul(json: &str) -> bool {
    json.contains("\\u0000")
}

pub(super) fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

pub(crate) fn phase_name(phase: Phase) -> Result<String, LogError> {
    match serde_json::to_value(phase) {
        Ok(Value::String(s)) => Ok(s),
        other => Err(LogError::Unavailable(format!(
            "phase {phase:?} does not serialise to a name: {other:?}"
        ))),
    }
}

/// The summary columns a commit writes from a state: see [`summary_set`].
pub(super) struct SummaryColumns {
    pub(super) status: &'static str,
    pub(super) phase: String,
    pub(super) pull_point: Option<Value>,
    pub(super) outcome: Option<Value>,
    pub(super) head_seq: i64,
    /// [`USAGE_COLUMNS`], in order.
    pub(super) usage: Vec<i64>,
    /// The error of a failed run, the reason of a cancelled one (U+0000,
    /// which `text` cannot hold, replaced).
    pub(super) error: Option<String>,
}

/// The run row's columns of [`crate::RunSummary::usage`] and
/// [`crate::RunSummary::steps`], in the order of [`SummaryColumns::usage`]
/// (`tokens_estimated` as 0 or 1).
pub(crate) const USAGE_COLUMNS: [&str; 10] = [
    "turns",
    "tool_calls",
    "active_ms",
    "input_tokens",
    "output_tokens",
    "cache_write_tokens",
    "cache_read_tokens",
    "tokens_estimated",
    "cost_usd_micros",
    "steps",
];

/// The `SET` list of an update writing a state's summary from parameters
/// `$first` (status), `$first+1` (phase), `+2` (pull point), `+3`
/// (outcome), `+4` (head), `+5` (`bigint[]` of [`USAGE_COLUMNS`]), `+6`
/// (error): seven parameters, [`SummaryColumns`]. `updated_at` is set to
/// `at` (an SQL expression: `now()` for a commit); `ended_at` to `at` by
/// the update that makes the run done, and kept after.
pub(super) fn summary_set(first: usize, at: &str) -> String {
    let [status, phase, pull_point, outcome, head, usage, error] =
        std::array::from_fn(|i| format!("${}", first + i));
    let mut set = format!(
        "status = {status}, phase = {phase}, pull_point = {pull_point}, outcome = {outcome}, head_seq = {head}"
    );
    for (i, column) in USAGE_COLUMNS.iter().enumerate() {
        let cell = format!("({usage}::bigint[])[{}]", i + 1);
        let value = match *column {
            "tokens_estimated" => format!("{cell} <> 0"),
            "steps" => format!("{cell}::integer"),
            _ => cell,
        };
        set.push_str(&format!(", {column} = {value}"));
    }
    set.push_str(&format!(
        ", error = {error}::text, ended_at = CASE WHEN {status}::text = 'done' THEN coalesce(ended_at, {at}) END, updated_at = {at}"
    ));
    set
}

fn bigint(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// `state`'s values of [`USAGE_COLUMNS`], in order (counts past `i64::MAX`
/// stored as `i64::MAX`).
pub(crate) fn usage_cells(state: &RunState) -> [i64; 10] {
    let u = &state.usage;
    [
        bigint(u.turns),
        bigint(u.tool_calls),
        bigint(u.active_ms),
        bigint(u.tokens.input_tokens),
        bigint(u.tokens.output_tokens),
        bigint(u.tokens.cache_write_tokens),
        bigint(u.tokens.cache_read_tokens),
        i64::from(u.tokens.estimated),
        bigint(u.cost_usd_micros),
        i64::from(crate::steps_of(state)),
    ]
}

impl SummaryColumns {
    pub(super) fn of(state: &RunState) -> Result<SummaryColumns, LogError> {
        let invalid = |e: serde_json::Error| LogError::Invalid {
            run_id: state.run_id,
            reason: format!("state does not serialise: {e}"),
        };
        Ok(SummaryColumns {
            status: RunStatus::of(state).as_str(),
            phase: phase_name(state.phase)?,
            pull_point: state
                .parked
                .as_ref()
                .map(serde_json::to_value)
                .transpose()
                .map_err(invalid)?,
            outcome: state
                .outcome
                .as_ref()
                .map(serde_json::to_value)
                .transpose()
                .map_err(invalid)?,
            head_seq: sql_seq(state.head_seq),
            usage: usage_cells(state).to_vec(),
            error: state
                .outcome
                .as_ref()
                .and_then(crate::error_of)
                .map(|e| e.replace('\0', "\u{FFFD}")),
        })
    }
}

/// Events as the columns of one multi-row insert, and the blobs they need.
pub(super) struct EncodedEvents {
    pub(super) seqs: Vec<i64>,
    pub(super) kinds: Vec<&'static str>,
    pub(super) ats: Vec<DateTime<Utc>>,
    pub(super) at_nanos: Vec<i32>,
    pub(super) payloads: Vec<Option<String>>,
    pub(super) blob_hashes: Vec<Option<String>>,
    /// `(hash, bytes)`, sorted by hash and deduplicated, so concurrent
    /// inserts of the same blobs take their locks in the same order.
    pub(super) blobs: Vec<(String, Vec<u8>)>,
}

pub(super) fn encode_events(
    run_id: Uuid,
    events: &[Event],
    blob_threshold: usize,
) -> Result<EncodedEvents, LogError> {
    let invalid = |reason: String| LogError::Invalid { run_id, reason };
    let mut out = EncodedEvents {
        seqs: Vec::with_capacity(events.len()),
        kinds: Vec::with_capacity(events.len()),
        ats: Vec::with_capacity(events.len()),
        at_nanos: Vec::with_capacity(events.len()),
        payloads: Vec::with_capacity(events.len()),
        blob_hashes: Vec::with_capacity(events.len()),
        blobs: Vec::new(),
    };
    for e in events {
        let seq =
            i64::try_from(e.seq).map_err(|_| invalid(format!("seq {} out of range", e.seq)))?;
        let json = serde_json::to_string(&e.kind)
            .map_err(|err| invalid(format!("event {} does not serialise: {err}", e.seq)))?;
        // Postgres keeps microseconds; the nanoseconds below are stored apart.
        let sub_micro = e.at.timestamp_subsec_nanos() % 1000;
        out.seqs.push(seq);
        out.kinds.push(e.kind.name());
        out.ats
            .push(e.at - chrono::Duration::nanoseconds(i64::from(sub_micro)));
        out.at_nanos.push(sub_micro as i32);
        if json.len() > blob_threshold || has_nul(&json) {
            let bytes = json.into_bytes();
            let hash = sha256_hex(&bytes);
            out.payloads.push(None);
            out.blob_hashes.push(Some(hash.clone()));
            out.blobs.push((hash, bytes));
        } else {
            out.payloads.push(Some(json));
            out.blob_hashes.push(None);
        }
    }
    out.blobs.sort_by(|a, b| a.0.cmp(&b.0));
    out.blobs.dedup_by(|a, b| a.0 == b.0);
    Ok(out)
}
