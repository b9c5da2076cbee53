//! One-statement commits and group commit for [`super::PgLog`] (see
//! [`super::CommitMode`]).
//!
//! A step is one statement, [`FENCED_COMMIT`], keyed by its run: the update
//! of the run row, fenced by the lease token, the lease's expiry (database
//! clock) and the head, drives every other write through data-modifying CTEs
//! (`… FROM fence`), so a refused fence writes nothing. A step that touches
//! no approval and no inbox item (most) is [`FENCED_APPEND`], the same
//! statement's first two parts. The statement answers whether the fence
//! held; only when it did not is the run row read to tell
//! [`LogError::LeaseLost`] from [`LogError::Conflict`].
//!
//! A [`Committer`] gathers the steps that arrive while its lanes are busy
//! into one group and sends `BEGIN`, the steps' statements (in run id order,
//! so two groups lock shared rows in the same order) and `COMMIT` pipelined
//! on one connection: one round trip and one fsync for the group. Every
//! step's caller gets its own run's answer. A statement that errors rolls the
//! group back (`COMMIT` of an aborted transaction is a rollback); the group's
//! steps are then written again one autocommit statement each (pipelined),
//! so the error fails its own step only. A `COMMIT` whose answer is lost
//! leaves every step of the group unknown ([`LogError::Unavailable`]), as for
//! a single commit.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, LazyLock};
use std::task::Poll;
use std::time::Duration;

use chrono::{DateTime, Utc};
use deadpool_postgres::{ClientWrapper, Pool};
use futures::future::{BoxFuture, MaybeDone};
use glia_proto::{Event, EventKind, Phase, RunState};
use serde_json::Value;
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio_postgres::types::ToSql;
use tokio_postgres::{Row, Statement};
use uuid::Uuid;

use super::codec::{
    EncodedEvents, SummaryColumns, col, seq_of, summary_set, unavailable, write_error,
};
use crate::{Lease, LogError};

/// The fence and the events of a step: the update of run `$1`'s row, fenced
/// by lease token `$2`, the lease's expiry and head `$3`, writing the summary
/// `$4`–`$10` ([`summary_set`]: status, phase, pull point, outcome, new
/// head, usage, error), drives the insert of the events `$11`–`$15` (seq,
/// kind, time, its nanoseconds, JSON payload), whose run id it supplies.
/// [`FENCED_APPEND`] and [`FENCED_COMMIT`] begin with it.
static FENCE_AND_EVENTS: LazyLock<String> = LazyLock::new(|| {
    format!(
        "WITH fence AS ( \
       UPDATE runs SET {} \
       WHERE id = $1 AND lease_token = $2 AND lease_expires_at > now() AND head_seq = $3 \
       RETURNING id, tenant), \
     ev AS ( \
       INSERT INTO events (run_id, seq, kind, at, at_nanos, payload) \
       SELECT f.id, t.seq, t.kind, t.at, t.at_nanos, t.payload::jsonb FROM fence f, \
         unnest($11::bigint[], $12::text[], $13::timestamptz[], $14::int4[], $15::text[]) AS t(seq, kind, at, at_nanos, payload))",
        summary_set(4, "now()")
    )
});

/// The answer of both step statements: whether the fence held.
const FENCE_HELD: &str = " SELECT EXISTS (SELECT 1 FROM fence) AS ok";

/// Most steps: [`FENCE_AND_EVENTS`] alone (parameters `$1`–`$15`), for a step
/// that requests and resolves no approval, consumes no inbox item and does
/// not end the run. It touches only the run row and the events: the
/// executor opens no other table or index for it.
pub(super) static FENCED_APPEND: LazyLock<String> =
    LazyLock::new(|| format!("{}{FENCE_HELD}", *FENCE_AND_EVENTS));

/// Any step: [`FENCE_AND_EVENTS`] and, driven by the fence too, `$16`–`$23`
/// approvals requested (call, tool, input, hash, requested at, expires at,
/// interrupted, already decided); `$24` calls resolved, `$25` the run ended
/// (closes pending approvals), `$26` inbox items consumed. Answers `ok` (the
/// fence held).
///
/// The conditions on parameters alone (`cardinality(…) > 0`) are one-time
/// filters, so the parts a step does not need read nothing; when they run,
/// they find the run's rows by index (`approvals_run_pending`,
/// `inbox_pending`), never by scanning the fleet's.
pub(super) static FENCED_COMMIT: LazyLock<String> = LazyLock::new(|| {
    format!(
        "{}, \
     requested AS ( \
       INSERT INTO approvals (run_id, tenant, call_id, tool, input, args_hash, requested_at, expires_at, interrupted, status, decided_at) \
       SELECT f.id, f.tenant, t.call_id, t.tool, t.input, t.args_hash, t.requested_at, t.expires_at, t.interrupted, \
         CASE WHEN t.decided THEN 'decided' ELSE 'pending' END, CASE WHEN t.decided THEN now() END \
       FROM fence f, unnest($16::text[], $17::text[], $18::json[], $19::text[], $20::timestamptz[], $21::timestamptz[], $22::bool[], $23::bool[]) \
         AS t(call_id, tool, input, args_hash, requested_at, expires_at, interrupted, decided)), \
     decided AS ( \
       UPDATE approvals SET status = 'decided', decided_at = now() \
       WHERE run_id = $1 AND status = 'pending' AND ($25 OR call_id = ANY($24::text[])) \
         AND ($25 OR cardinality($24::text[]) > 0) AND EXISTS (SELECT 1 FROM fence)), \
     consumed AS ( \
       UPDATE inbox SET consumed = true WHERE run_id = $1 AND id = ANY($26::bigint[]) AND NOT consumed \
         AND cardinality($26::bigint[]) > 0 AND EXISTS (SELECT 1 FROM fence)){FENCE_HELD}",
        *FENCE_AND_EVENTS
    )
});

/// The run row, read when a fence refused a step.
const DIAGNOSE: &str = "SELECT head_seq, lease_token, coalesce(lease_expires_at > now(), false) AS live FROM runs WHERE id = $1";

/// A step's parameters of [`FENCED_COMMIT`] (or, when it needs only those,
/// of [`FENCED_APPEND`]), owned so that it can wait for a group.
pub(super) struct Step {
    run_id: Uuid,
    token: Uuid,
    expected: i64,
    status: &'static str,
    phase: String,
    pull_point: Option<Value>,
    outcome: Option<Value>,
    head_seq: i64,
    usage: Vec<i64>,
    error: Option<String>,
    seqs: Vec<i64>,
    kinds: Vec<&'static str>,
    ats: Vec<DateTime<Utc>>,
    at_nanos: Vec<i32>,
    payloads: Vec<Option<String>>,
    calls: Vec<String>,
    tools: Vec<String>,
    inputs: Vec<Value>,
    hashes: Vec<String>,
    requested_at: Vec<DateTime<Utc>>,
    expires_at: Vec<Option<DateTime<Utc>>>,
    interrupted: Vec<bool>,
    decided: Vec<bool>,
    resolved: Vec<String>,
    ended: bool,
    consumed: Vec<i64>,
}

impl Step {
    /// The step appending `events` (not empty, no blobs) under `lease`.
    pub(super) fn new(
        lease: &Lease,
        events: &[Event],
        state: &RunState,
        consumed: &[i64],
        encoded: EncodedEvents,
        columns: SummaryColumns,
    ) -> Step {
        let ended = state.phase == Phase::Done;
        let resolved: Vec<String> = events
            .iter()
            .filter_map(|e| match &e.kind {
                EventKind::ApprovalResolved { call_id, .. } => Some(call_id.clone()),
                _ => None,
            })
            .collect();
        let mut step = Step {
            run_id: lease.run_id,
            token: lease.token,
            expected: encoded
                .seqs
                .first()
                .map_or(columns.head_seq, |first| first - 1),
            status: columns.status,
            phase: columns.phase,
            pull_point: columns.pull_point,
            outcome: columns.outcome,
            head_seq: columns.head_seq,
            usage: columns.usage,
            error: columns.error,
            seqs: encoded.seqs,
            kinds: encoded.kinds,
            ats: encoded.ats,
            at_nanos: encoded.at_nanos,
            payloads: encoded.payloads,
            calls: vec![],
            tools: vec![],
            inputs: vec![],
            hashes: vec![],
            requested_at: vec![],
            expires_at: vec![],
            interrupted: vec![],
            decided: vec![],
            resolved: vec![],
            ended,
            consumed: consumed.to_vec(),
        };
        for e in events {
            if let EventKind::ApprovalRequested {
                call_id,
                tool,
                input,
                args_hash,
                expires_at,
                interrupted,
            } = &e.kind
            {
                // Resolved in the same step, or the run ended: never pending.
                step.decided.push(ended || resolved.contains(call_id));
                step.calls.push(call_id.clone());
                step.tools.push(tool.clone());
                step.inputs.push(input.clone());
                step.hashes.push(args_hash.clone());
                step.requested_at.push(e.at);
                step.expires_at.push(*expires_at);
                step.interrupted.push(*interrupted);
            }
        }
        step.resolved = resolved;
        step
    }

    /// Whether the step needs only [`FENCED_APPEND`].
    fn appends_only(&self) -> bool {
        self.calls.is_empty() && self.resolved.is_empty() && !self.ended && self.consumed.is_empty()
    }

    /// Its statement, of the two prepared on a connection, and how many of
    /// [`Step::params`] it takes.
    fn statement<'a>(&self, statements: &'a Statements) -> (&'a Statement, usize) {
        if self.appends_only() {
            (&statements.append, 15)
        } else {
            (&statements.commit, 26)
        }
    }

    fn params(&self) -> [&(dyn ToSql + Sync); 26] {
        [
            &self.run_id,
            &self.token,
            &self.expected,
            &self.status,
            &self.phase,
            &self.pull_point,
            &self.outcome,
            &self.head_seq,
            &self.usage,
            &self.error,
            &self.seqs,
            &self.kinds,
            &self.ats,
            &self.at_nanos,
            &self.payloads,
            &self.calls,
            &self.tools,
            &self.inputs,
            &self.hashes,
            &self.requested_at,
            &self.expires_at,
            &self.interrupted,
            &self.decided,
            &self.resolved,
            &self.ended,
            &self.consumed,
        ]
    }
}

/// [`FENCED_APPEND`] and [`FENCED_COMMIT`], prepared on one connection.
struct Statements {
    append: Statement,
    commit: Statement,
}

impl Statements {
    async fn prepare(client: &ClientWrapper) -> Result<Statements, tokio_postgres::Error> {
        let (append, commit) = futures::try_join!(
            client.prepare_cached(&FENCED_APPEND),
            client.prepare_cached(&FENCED_COMMIT)
        )?;
        Ok(Statements { append, commit })
    }
}

/// The answer of a step whose statement ran: `Ok` when the fence held, else
/// why it did not (one read of the run row).
async fn outcome(client: &ClientWrapper, step: &Step, row: &Row) -> Result<(), LogError> {
    if col::<bool>(row, "ok")? {
        return Ok(());
    }
    let run_id = step.run_id;
    let st = client
        .prepare_cached(DIAGNOSE)
        .await
        .map_err(|e| unavailable("commit", &e))?;
    let row = client
        .query_opt(&st, &[&run_id])
        .await
        .map_err(|e| unavailable("commit", &e))?
        .ok_or(LogError::NotFound(run_id))?;
    let token: Option<Uuid> = col(&row, "lease_token")?;
    let head = seq_of(col(&row, "head_seq")?, "head_seq")?;
    let expected = seq_of(step.expected, "expected head")?;
    if token != Some(step.token) || !col::<bool>(&row, "live")? || head == expected {
        // Equal heads: the lease lapsed between the statement and this read.
        return Err(LogError::LeaseLost(run_id));
    }
    Err(LogError::Conflict {
        run_id,
        expected,
        actual: head,
    })
}

/// Each step as its own autocommit statement, pipelined: one fsync each, and
/// each answer its own.
pub(super) async fn write_alone(
    client: &ClientWrapper,
    steps: &[&Step],
) -> Vec<Result<(), LogError>> {
    let statements = match Statements::prepare(client).await {
        Ok(st) => st,
        Err(e) => {
            return steps
                .iter()
                .map(|s| Err(write_error(s.run_id, "commit", &e)))
                .collect();
        }
    };
    let params: Vec<_> = steps.iter().map(|s| s.params()).collect();
    let rows = futures::future::join_all(steps.iter().zip(&params).map(|(s, p)| {
        let (st, n) = s.statement(&statements);
        client.query_one(st, &p[..n])
    }))
    .await;
    let mut out = Vec::with_capacity(steps.len());
    for (step, row) in steps.iter().zip(rows) {
        out.push(match row {
            Ok(row) => outcome(client, step, &row).await,
            Err(e) => Err(write_error(step.run_id, "commit", &e)),
        });
    }
    out
}

/// What one pipelined request of a group answered.
enum Answer {
    Done,
    Row(Row),
}

/// `BEGIN`, the steps' statements, `COMMIT`, pipelined on `client`.
async fn write_group(client: &ClientWrapper, steps: &[&Step]) -> Vec<Result<(), LogError>> {
    if steps.len() == 1 {
        return write_alone(client, steps).await;
    }
    let statements = match Statements::prepare(client).await {
        Ok(st) => st,
        Err(e) => {
            return steps
                .iter()
                .map(|s| Err(write_error(s.run_id, "commit", &e)))
                .collect();
        }
    };
    let params: Vec<_> = steps.iter().map(|s| s.params()).collect();
    let mut requests: Vec<MaybeDone<BoxFuture<'_, Result<Answer, tokio_postgres::Error>>>> =
        Vec::with_capacity(steps.len() + 2);
    requests.push(futures::future::maybe_done(Box::pin(async {
        client.batch_execute("BEGIN").await.map(|_| Answer::Done)
    })));
    for (step, p) in steps.iter().zip(&params) {
        let (st, n) = step.statement(&statements);
        requests.push(futures::future::maybe_done(Box::pin(async move {
            client.query_one(st, &p[..n]).await.map(Answer::Row)
        })));
    }
    requests.push(futures::future::maybe_done(Box::pin(async {
        client.batch_execute("COMMIT").await.map(|_| Answer::Done)
    })));
    // Polled in order, every time: a request is sent when first polled, so
    // they go out as BEGIN, the steps, COMMIT, in one write.
    futures::future::poll_fn(|cx| {
        let mut done = true;
        for r in requests.iter_mut() {
            done &= Pin::new(r).poll(cx).is_ready();
        }
        if done { Poll::Ready(()) } else { Poll::Pending }
    })
    .await;
    let mut answers: Vec<Result<Answer, tokio_postgres::Error>> = requests
        .iter_mut()
        .map(|r| {
            Pin::new(r)
                .take_output()
                .unwrap_or_else(|| Ok(Answer::Done))
        })
        .collect();
    let commit = answers.pop().unwrap_or(Ok(Answer::Done));
    let rows: Vec<_> = answers.drain(1..).collect();
    let begin = answers.pop().unwrap_or(Ok(Answer::Done));
    if let Err(e) = begin {
        return steps
            .iter()
            .map(|s| Err(unavailable(&format!("commit (run {})", s.run_id), &e)))
            .collect();
    }
    if rows.iter().any(|r| r.is_err()) {
        // Rolled back (or the connection broke: then the retry fails too).
        if client.is_closed() {
            return steps
                .iter()
                .map(|s| {
                    Err(LogError::Unavailable(format!(
                        "commit (run {}): connection closed",
                        s.run_id
                    )))
                })
                .collect();
        }
        tracing::debug!(
            steps = steps.len(),
            "a statement of a group commit failed; writing its steps one by one"
        );
        return write_alone(client, steps).await;
    }
    if let Err(e) = commit {
        return steps
            .iter()
            .map(|s| Err(unavailable(&format!("commit (run {})", s.run_id), &e)))
            .collect();
    }
    let mut out = Vec::with_capacity(steps.len());
    for (step, row) in steps.iter().zip(rows) {
        out.push(match row {
            Ok(Answer::Row(row)) => outcome(client, step, &row).await,
            _ => Err(LogError::Unavailable("commit: no answer".into())),
        });
    }
    out
}

type Request = (Step, oneshot::Sender<Result<(), LogError>>);

/// Gathers a worker's concurrent steps into groups (see the module docs).
/// Cheap to clone; its task ends when the last clone is dropped.
#[derive(Clone)]
pub(super) struct Committer {
    tx: mpsc::UnboundedSender<Request>,
}

impl Committer {
    /// Start the gathering task: at most `lanes` groups in flight, each at
    /// most `max` steps, each bounded by `timeout`.
    pub(super) fn start(pool: Pool, timeout: Duration, lanes: usize, max: usize) -> Committer {
        let (tx, mut rx) = mpsc::unbounded_channel::<Request>();
        let lanes = Arc::new(Semaphore::new(lanes.max(1)));
        let max = max.max(1);
        tokio::spawn(async move {
            loop {
                // Wait for a free lane first: steps arriving meanwhile gather.
                let Ok(permit) = lanes.clone().acquire_owned().await else {
                    return;
                };
                let Some(first) = rx.recv().await else { return };
                let mut group = vec![first];
                while group.len() < max {
                    match rx.try_recv() {
                        Ok(r) => group.push(r),
                        Err(_) => break,
                    }
                }
                let pool = pool.clone();
                tokio::spawn(async move {
                    group.sort_by_key(|(s, _)| s.run_id);
                    let results = write_pooled(
                        &pool,
                        timeout,
                        &group.iter().map(|(s, _)| s).collect::<Vec<_>>(),
                    )
                    .await;
                    for ((_, reply), result) in group.into_iter().zip(results) {
                        let _ = reply.send(result);
                    }
                    drop(permit);
                });
            }
        });
        Committer { tx }
    }

    /// Write `step` in the next group; its run's answer.
    pub(super) async fn submit(&self, step: Step) -> Result<(), LogError> {
        let (reply, answer) = oneshot::channel();
        self.tx
            .send((step, reply))
            .map_err(|_| LogError::Unavailable("commit: the group committer stopped".into()))?;
        answer.await.map_err(|_| {
            LogError::Unavailable("commit: the group committer dropped the step".into())
        })?
    }
}

/// A group on a pooled connection, within `timeout`; a connection left in
/// an unknown state (timed out mid-group) is closed, not returned.
async fn write_pooled(
    pool: &Pool,
    timeout: Duration,
    steps: &[&Step],
) -> Vec<Result<(), LogError>> {
    let client = match pool.get().await {
        Ok(c) => c,
        Err(e) => {
            return steps
                .iter()
                .map(|_| Err(LogError::Unavailable(format!("database connection: {e}"))))
                .collect();
        }
    };
    match tokio::time::timeout(timeout, write_group(&client, steps)).await {
        Ok(results) => results,
        Err(_) => {
            drop(deadpool_postgres::Object::take(client));
            steps
                .iter()
                .map(|_| {
                    Err(LogError::Unavailable(format!(
                        "commit: no answer within {timeout:?}"
                    )))
                })
                .collect()
        }
    }
}

// In a file of its own: it uses the crate's test kit, which uses the
// parent module (`PgLog`), and a test module inline would make this module
// use it too.
#[cfg(test)]
mod tests;
