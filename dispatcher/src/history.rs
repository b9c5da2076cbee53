//! Approval history read from the event log, the source of truth: one
//! [`ApprovalRecord`] per `approval.requested`, completed by the
//! `approval.escalated` and `approval.resolved` that answer it.
//!
//! The `approvals` table of the [`EventLog`] is an
//! index (what is pending, what is past its deadline); who decided what and
//! when comes from the events, so the API's approval rows, the inbox's
//! history page, its CSV export and `glia approvals history` all agree with
//! the log.

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, Utc};
use glia_backends::{ApprovalFilter, ApprovalRow, EventLog, LogError, RunLog, RunSummary};
use glia_proto::{Decision, Event, EventKind};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

/// Events read per page while folding a run's log.
const PAGE: usize = 1000;

/// What became of an approval request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Resolution {
    /// Nobody decided yet.
    Pending,
    /// A person approved the call as proposed.
    Approved,
    /// A person approved it with edited arguments.
    Edited,
    /// A person rejected it.
    Rejected,
    /// Nobody decided before the deadline ([`Decision::Expire`]).
    Expired,
    /// The run ended (cancelled, failed) before anyone decided.
    Abandoned,
}

impl Resolution {
    /// `pending`, `approved`, `edited`, `rejected`, `expired` or `abandoned`.
    pub fn as_str(self) -> &'static str {
        match self {
            Resolution::Pending => "pending",
            Resolution::Approved => "approved",
            Resolution::Edited => "edited",
            Resolution::Rejected => "rejected",
            Resolution::Expired => "expired",
            Resolution::Abandoned => "abandoned",
        }
    }
}

/// One approval request and what became of it. JSON field names as below;
/// times are RFC 3339 UTC, `wait_ms` in milliseconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalRecord {
    /// The run.
    pub run_id: Uuid,
    /// Its tenant.
    pub tenant: String,
    /// The run's batch, if any.
    #[serde(default)]
    pub batch_id: Option<Uuid>,
    /// The run's goal.
    pub goal: String,
    /// The run's agent: its configured model (e.g. `claude-sonnet-4-5`, `script:refund`).
    pub agent: String,
    /// The call.
    pub call_id: String,
    /// Tool name.
    pub tool: String,
    /// Arguments the approver was shown.
    pub input: Value,
    /// Their hash (what a decision quotes).
    pub args_hash: String,
    /// `seq` of the `approval.requested` event.
    pub request_seq: u64,
    /// When it was requested.
    pub requested_at: DateTime<Utc>,
    /// Its deadline, if the run set one.
    #[serde(default)]
    pub expires_at: Option<DateTime<Utc>>,
    /// The call had started once and its worker died: it may already have run.
    #[serde(default)]
    pub interrupted: bool,
    /// When it was escalated (`approval.escalated`), if it was.
    #[serde(default)]
    pub escalated_at: Option<DateTime<Utc>>,
    /// What became of it.
    pub resolution: Resolution,
    /// The decision as recorded (`{"kind": "reject", "reason": …}`, …).
    #[serde(default)]
    pub decision: Option<Decision>,
    /// Who decided: the token's principal name (`reconciler` for an expiry).
    #[serde(default)]
    pub decided_by: Option<String>,
    /// When the decision was recorded.
    #[serde(default)]
    pub decided_at: Option<DateTime<Utc>>,
    /// From request to decision (or to now while pending), in ms.
    pub wait_ms: i64,
    /// Attempts to decide it that lost to the decision recorded
    /// (`approval.contested`: two approvers racing, or a stale page), oldest first.
    #[serde(default)]
    pub contested: Vec<LostAttempt>,
}

/// An attempt to decide an approval that another decision had already
/// answered (`approval.contested`). JSON: `{"by": "bob", "chose": "reject",
/// "attempted_at": "2025-…"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LostAttempt {
    /// Who tried (the token's principal name).
    pub by: Option<String>,
    /// What they chose: `approve`, `reject` or `edit`.
    pub chose: glia_proto::DecisionChoice,
    /// When the dispatcher refused it.
    pub attempted_at: DateTime<Utc>,
}

impl ApprovalRecord {
    /// A pending request past its deadline.
    pub fn overdue(&self, now: DateTime<Utc>) -> bool {
        self.resolution == Resolution::Pending && self.expires_at.is_some_and(|t| t <= now)
    }

    /// The edited arguments, for an edit.
    pub fn edited_input(&self) -> Option<&Value> {
        match &self.decision {
            Some(Decision::Edit { input }) => Some(input),
            _ => None,
        }
    }
}

/// Fold `run`'s events into its approval records, oldest request first.
/// `now` sets the wait of pending ones.
pub fn records_of(run: &RunSummary, events: &[Event], now: DateTime<Utc>) -> Vec<ApprovalRecord> {
    let agent = events
        .iter()
        .find_map(|e| match &e.kind {
            EventKind::SessionStart { config, .. } => Some(config.model.clone()),
            _ => None,
        })
        .unwrap_or_default();
    let mut records: Vec<ApprovalRecord> = Vec::new();
    // Call id → index of its open (undecided) request.
    let mut open: HashMap<String, usize> = HashMap::new();
    for e in events {
        match &e.kind {
            EventKind::ApprovalRequested {
                call_id,
                tool,
                input,
                args_hash,
                expires_at,
                interrupted,
            } => {
                open.insert(call_id.clone(), records.len());
                records.push(ApprovalRecord {
                    run_id: run.run_id,
                    tenant: run.tenant.clone(),
                    batch_id: run.batch_id,
                    goal: run.goal.clone(),
                    agent: agent.clone(),
                    call_id: call_id.clone(),
                    tool: tool.clone(),
                    input: input.clone(),
                    args_hash: args_hash.clone(),
                    request_seq: e.seq,
                    requested_at: e.at,
                    expires_at: *expires_at,
                    interrupted: *interrupted,
                    escalated_at: None,
                    resolution: Resolution::Pending,
                    decision: None,
                    decided_by: None,
                    decided_at: None,
                    wait_ms: 0,
                    contested: Vec::new(),
                });
            }
            EventKind::ApprovalEscalated { call_id, .. } => {
                if let Some(&i) = open.get(call_id) {
                    records[i].escalated_at.get_or_insert(e.at);
                }
            }
            EventKind::ApprovalResolved {
                call_id,
                decision,
                by,
                ..
            } => {
                if let Some(i) = open.remove(call_id) {
                    let r = &mut records[i];
                    r.resolution = match decision {
                        Decision::Approve => Resolution::Approved,
                        Decision::Edit { .. } => Resolution::Edited,
                        Decision::Reject { .. } => Resolution::Rejected,
                        Decision::Expire => Resolution::Expired,
                    };
                    r.decision = Some(decision.clone());
                    r.decided_by = by.clone();
                    r.decided_at = Some(e.at);
                }
            }
            EventKind::ApprovalContested {
                call_id,
                by,
                chose,
                attempted_at,
            } => {
                // The call's latest request: the one the attempt was made on.
                if let Some(r) = records.iter_mut().rev().find(|r| &r.call_id == call_id) {
                    r.contested.push(LostAttempt {
                        by: by.clone(),
                        chose: *chose,
                        attempted_at: *attempted_at,
                    });
                }
            }
            EventKind::SessionComplete { .. } | EventKind::SessionCancel { .. } => {
                for (_, i) in open.drain() {
                    records[i].resolution = Resolution::Abandoned;
                    records[i].decided_at = Some(e.at);
                }
            }
            _ => {}
        }
    }
    for r in &mut records {
        let end = r.decided_at.unwrap_or(now);
        r.wait_ms = (end - r.requested_at).num_milliseconds().max(0);
    }
    records
}

/// Every event of a run, in order (paged reads).
pub async fn all_events(log: &dyn RunLog, run_id: Uuid) -> Result<Vec<Event>, LogError> {
    let mut out = Vec::new();
    loop {
        let after = out.last().map_or(0, |e: &Event| e.seq);
        let page = log.events(run_id, after, PAGE).await?;
        let n = page.len();
        out.extend(page);
        if n < PAGE {
            return Ok(out);
        }
    }
}

/// The approval records of one run.
pub async fn run_records(
    log: &dyn RunLog,
    run: &RunSummary,
) -> Result<Vec<ApprovalRecord>, LogError> {
    Ok(records_of(
        run,
        &all_events(log, run.run_id).await?,
        Utc::now(),
    ))
}

/// The records behind `rows` (an [`Approvals::approvals`](glia_backends::Approvals::approvals) page), in the rows'
/// order: each run's log is read once. A row is matched to the record of the
/// same call requested at the same time (a call asked about twice after a
/// crash has two); rows whose run vanished are left out.
pub async fn records_for_rows(
    log: &dyn RunLog,
    rows: &[ApprovalRow],
) -> Result<Vec<ApprovalRecord>, LogError> {
    let mut by_run: BTreeMap<Uuid, Vec<ApprovalRecord>> = BTreeMap::new();
    for row in rows {
        if by_run.contains_key(&row.run_id) {
            continue;
        }
        let run = match log.get_run(row.run_id).await {
            Ok(run) => run,
            Err(LogError::NotFound(_)) => continue,
            Err(e) => return Err(e),
        };
        by_run.insert(row.run_id, run_records(log, &run).await?);
    }
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        let Some(records) = by_run.get(&row.run_id) else {
            continue;
        };
        let same_call = || records.iter().filter(|r| r.call_id == row.call_id);
        let found = same_call()
            .find(|r| r.requested_at == row.requested_at)
            .or_else(|| same_call().next_back());
        if let Some(r) = found {
            out.push(r.clone());
        }
    }
    Ok(out)
}

/// Which records [`history`] returns.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct HistoryQuery {
    /// Only this tool's.
    #[serde(default)]
    pub tool: Option<String>,
    /// Only runs of this agent (the run's model).
    #[serde(default)]
    pub agent: Option<String>,
    /// Only this batch's runs.
    #[serde(default)]
    pub batch_id: Option<Uuid>,
    /// Only this resolution: `pending`, `approved`, `edited`, `rejected`, `expired`, `abandoned`; `escalated` for escalated ones.
    #[serde(default)]
    pub resolution: Option<String>,
    /// Only this decider.
    #[serde(default)]
    pub decided_by: Option<String>,
    /// At most this many (default and cap: 1,000).
    #[serde(default)]
    pub limit: Option<usize>,
    /// `json` (default) or `csv` (for `GET /v1/approvals/history`).
    #[serde(default)]
    #[param(inline)]
    pub format: Option<HistoryFormat>,
}

/// How `GET /v1/approvals/history` answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum HistoryFormat {
    /// `{"approvals": [...]}`.
    Json,
    /// CSV, see [`to_csv`].
    Csv,
}

impl HistoryQuery {
    /// True when `r` passes every filter.
    pub fn admits(&self, r: &ApprovalRecord) -> bool {
        let eq = |want: &Option<String>, have: &str| {
            want.as_deref().is_none_or(|w| w.is_empty() || w == have)
        };
        eq(&self.tool, &r.tool)
            && eq(&self.agent, &r.agent)
            && self.batch_id.is_none_or(|b| r.batch_id == Some(b))
            && match self.resolution.as_deref() {
                None | Some("") => true,
                Some("escalated") => r.escalated_at.is_some(),
                Some(res) => r.resolution.as_str() == res,
            }
            && eq(&self.decided_by, r.decided_by.as_deref().unwrap_or(""))
    }
}

/// The approval history of `tenant` (every tenant for `None`), newest
/// request first: the approvals index names the runs (at most 1,000 of the
/// newest rows), their logs say what happened.
pub async fn history(
    log: &dyn EventLog,
    tenant: Option<String>,
    q: &HistoryQuery,
) -> Result<Vec<ApprovalRecord>, LogError> {
    let limit = q.limit.unwrap_or(1000).clamp(1, 1000);
    let filter = ApprovalFilter {
        tenant,
        tool: q.tool.clone().filter(|t| !t.is_empty()),
        limit: 1000,
        ..ApprovalFilter::default()
    };
    let rows = log.approvals(&filter).await?;
    let mut records = records_for_rows(log, &rows).await?;
    records.retain(|r| q.admits(r));
    records.reverse();
    records.truncate(limit);
    Ok(records)
}

/// `records` as CSV (RFC 4180, header row first): run_id, call_id, tool,
/// agent, batch_id, requested_at, expires_at, escalated_at, resolution,
/// decided_by, decided_at, wait_ms, interrupted, reason, input, edited_input,
/// lost_attempts (`by chose at`, `; `-separated).
/// Cells that a spreadsheet would take for a formula (`=`, `+`, `-`, `@`)
/// are prefixed with `'`.
pub fn to_csv(records: &[ApprovalRecord]) -> String {
    fn cell(s: &str) -> String {
        let s = if s.starts_with(['=', '+', '-', '@', '\t', '\r']) {
            format!("'{s}")
        } else {
            s.to_owned()
        };
        if s.contains([',', '"', '\n', '\r']) {
            format!("\"{}\"", s.replace('"', "\"\""))
        } else {
            s
        }
    }
    let time = |t: Option<DateTime<Utc>>| t.map(|t| t.to_rfc3339()).unwrap_or_default();
    let mut out = String::from(
        "run_id,call_id,tool,agent,batch_id,requested_at,expires_at,escalated_at,resolution,decided_by,decided_at,wait_ms,interrupted,reason,input,edited_input,lost_attempts\r\n",
    );
    for r in records {
        let reason = match &r.decision {
            Some(Decision::Reject { reason }) => reason.clone(),
            _ => String::new(),
        };
        let row = [
            r.run_id.to_string(),
            r.call_id.clone(),
            r.tool.clone(),
            r.agent.clone(),
            r.batch_id.map(|b| b.to_string()).unwrap_or_default(),
            r.requested_at.to_rfc3339(),
            time(r.expires_at),
            time(r.escalated_at),
            r.resolution.as_str().to_owned(),
            r.decided_by.clone().unwrap_or_default(),
            time(r.decided_at),
            r.wait_ms.to_string(),
            r.interrupted.to_string(),
            reason,
            r.input.to_string(),
            r.edited_input().map(|v| v.to_string()).unwrap_or_default(),
            r.contested
                .iter()
                .map(|a| {
                    format!(
                        "{} {} {}",
                        a.by.as_deref().unwrap_or("?"),
                        a.chose.as_str(),
                        a.attempted_at.to_rfc3339()
                    )
                })
                .collect::<Vec<_>>()
                .join("; "),
        ];
        out.push_str(&row.iter().map(|c| cell(c)).collect::<Vec<_>>().join(","));
        out.push_str("\r\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use glia_backends::RunStatus;
    use glia_proto::{Phase, RunConfig};
    use serde_json::json;

    fn ev(seq: u64, secs: i64, kind: EventKind) -> Event {
        Event {
            run_id: Uuid::nil(),
            seq,
            at: DateTime::from_timestamp(secs, 0).unwrap(),
            kind,
        }
    }

    fn run() -> RunSummary {
        let t = DateTime::from_timestamp(0, 0).unwrap();
        RunSummary {
            run_id: Uuid::nil(),
            tenant: "a".into(),
            batch_id: None,
            goal: "g".into(),
            status: RunStatus::Parked,
            phase: Phase::AwaitingTool,
            pull_point: None,
            outcome: None,
            head_seq: 9,
            created_at: t,
            updated_at: t,
            agent: None,
            agent_version: None,
            tags: Vec::new(),
            metadata: Default::default(),
            custom_id: None,
            usage: Default::default(),
            steps: 0,
            error: None,
            ended_at: None,
            trace_id: glia_backends::trace_id(Uuid::nil()),
            erased_at: None,
            erased_by: None,
            parent_run_id: None,
            parent_call_id: None,
            depth: 0,
        }
    }

    fn requested(call: &str) -> EventKind {
        EventKind::ApprovalRequested {
            call_id: call.into(),
            tool: "refund".into(),
            input: json!({"x": 1}),
            args_hash: "h".into(),
            expires_at: None,
            interrupted: false,
        }
    }

    #[test]
    fn requests_are_completed_by_their_escalation_and_decision() {
        let config = RunConfig {
            model: "script:r".into(),
            ..RunConfig::default()
        };
        let events = vec![
            ev(
                1,
                0,
                EventKind::SessionStart {
                    redactions: Vec::new(),
                    goal: "g".into(),
                    config,
                },
            ),
            ev(2, 10, requested("c1")),
            ev(3, 10, requested("c2")),
            ev(
                4,
                20,
                EventKind::ApprovalEscalated {
                    call_id: "c1".into(),
                    expires_at: None,
                },
            ),
            ev(
                5,
                25,
                EventKind::ApprovalResolved {
                    call_id: "c1".into(),
                    args_hash: "h".into(),
                    decision: Decision::Expire,
                    by: Some("reconciler".into()),
                },
            ),
            ev(
                6,
                30,
                EventKind::ApprovalResolved {
                    call_id: "c2".into(),
                    args_hash: "h".into(),
                    decision: Decision::Reject {
                        reason: "no".into(),
                    },
                    by: Some("ana".into()),
                },
            ),
            ev(7, 31, requested("c1")),
        ];
        let now = DateTime::from_timestamp(100, 0).unwrap();
        let r = records_of(&run(), &events, now);
        assert_eq!(r.len(), 3);
        assert_eq!(
            (
                r[0].resolution,
                r[0].escalated_at.map(|t| t.timestamp()),
                r[0].wait_ms
            ),
            (Resolution::Expired, Some(20), 15_000)
        );
        assert_eq!(
            (
                r[1].resolution,
                r[1].decided_by.as_deref(),
                r[1].agent.as_str()
            ),
            (Resolution::Rejected, Some("ana"), "script:r")
        );
        assert_eq!(
            (r[2].resolution, r[2].request_seq, r[2].wait_ms),
            (Resolution::Pending, 7, 69_000)
        );
        assert!(
            HistoryQuery {
                resolution: Some("escalated".into()),
                ..Default::default()
            }
            .admits(&r[0])
        );
        assert!(
            !HistoryQuery {
                decided_by: Some("bob".into()),
                ..Default::default()
            }
            .admits(&r[1])
        );
    }

    #[test]
    fn csv_quotes_and_defuses_formulas() {
        let events = vec![
            ev(2, 10, requested("c1")),
            ev(
                3,
                11,
                EventKind::ApprovalResolved {
                    call_id: "c1".into(),
                    args_hash: "h".into(),
                    decision: Decision::Reject {
                        reason: "=HYPERLINK(\"x\"), no".into(),
                    },
                    by: Some("ana".into()),
                },
            ),
        ];
        let csv = to_csv(&records_of(&run(), &events, Utc::now()));
        let line = csv.lines().nth(1).unwrap();
        assert!(line.contains(r#""'=HYPERLINK(""x""), no""#), "{line}");
        assert!(line.contains(r#""{""x"":1}""#), "{line}");
    }
}

/// An approvals-index row with what became of it (from the log):
/// `GET /v1/approvals` answers these. JSON: the [`ApprovalRow`] fields plus
/// `decision`, `decided_by`, `decided_at`, `escalated_at` (null while pending).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalView {
    /// The index row.
    #[serde(flatten)]
    pub row: ApprovalRow,
    /// The decision as recorded.
    #[serde(default)]
    pub decision: Option<Decision>,
    /// Who decided (the token's principal name; `reconciler` for an expiry).
    #[serde(default)]
    pub decided_by: Option<String>,
    /// When the decision was recorded.
    #[serde(default)]
    pub decided_at: Option<DateTime<Utc>>,
    /// When it was escalated, if it was.
    #[serde(default)]
    pub escalated_at: Option<DateTime<Utc>>,
}

/// `rows` with their decisions, decider and times from the log (see [`records_for_rows`]).
pub async fn views(
    log: &dyn RunLog,
    rows: Vec<ApprovalRow>,
) -> Result<Vec<ApprovalView>, LogError> {
    let decided: Vec<ApprovalRow> = rows
        .iter()
        .filter(|r| r.status == glia_backends::ApprovalStatus::Decided || r.escalated)
        .cloned()
        .collect();
    let records = records_for_rows(log, &decided).await?;
    Ok(rows
        .into_iter()
        .map(|row| {
            let rec = records
                .iter()
                .find(|r| {
                    r.run_id == row.run_id
                        && r.call_id == row.call_id
                        && r.requested_at == row.requested_at
                })
                .or_else(|| {
                    records
                        .iter()
                        .rev()
                        .find(|r| r.run_id == row.run_id && r.call_id == row.call_id)
                });
            ApprovalView {
                decision: rec.and_then(|r| r.decision.clone()),
                decided_by: rec.and_then(|r| r.decided_by.clone()),
                decided_at: rec.and_then(|r| r.decided_at),
                escalated_at: rec.and_then(|r| r.escalated_at),
                row,
            }
        })
        .collect())
}
