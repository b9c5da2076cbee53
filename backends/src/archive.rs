//! Moving runs between event logs: a single node's SQLite file and a
//! fleet's Postgres, either way (`glia export`, `glia import`).
//!
//! ## The format (version 1)
//!
//! JSON Lines, UTF-8. The first line is an [`ArchiveHeader`]:
//! `{"format": "glia-runs", "version": 3, "exported_at": "…", "source": "sqlite:node.db"}`.
//! Every further line is one [`RunRecord`]: the run's identity (id, tenant,
//! idempotency key, batch, admission time), its whole event log (each event as
//! the API serves it: `{"run_id", "seq", "at", "type", "data"}`), its
//! approvals (pending and decided, with deadlines, escalation and
//! interruption marks) and its inbox (payloads posted and not yet applied,
//! and the dedupe keys of those applied, so a decision is still accepted only
//! once). Leases, checkpoints, outbox and queued jobs are not carried: the
//! importing log has no lease on the run, rebuilds state from the events, and
//! writes a job for each run that has work.
//!
//! A reader refuses a file whose `format` is not `glia-runs` or whose
//! `version` it does not know; new fields are added only with a new version.
//! Version 2 added [`RunRecord::erased`] (an erased run travels as its
//! tombstones and stays erased where it is imported); version 3 the parent
//! link of a child run ([`RunRecord::parent_run_id`], `parent_call_id`,
//! `depth`; issue 32). Earlier files are read as before.
//!
//! ## Guarantees
//!
//! [`Archive::import_run`] is one transaction per run, and idempotent: a run
//! already present at the same head is left alone ([`Imported::AlreadyPresent`]),
//! so an interrupted import can be run again. The events must replay
//! ([`RunRecord::validate`]); a run present at another head is
//! [`LogError::Conflict`]. Export a node while it is stopped (the SQLite file
//! lock enforces it); runs exported from a live fleet are each a consistent
//! snapshot, but may have moved on since.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use glia_proto::{Event, Payload, RunState};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use crate::{ApprovalStatus, EventLog, LogError};

/// `format` of the header line.
pub const FORMAT: &str = "glia-runs";
/// The version this build writes; it reads this one and every earlier one.
pub const VERSION: u32 = 3;

/// The first line of an export.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArchiveHeader {
    /// Always [`FORMAT`].
    pub format: String,
    /// [`VERSION`] when written by this build.
    pub version: u32,
    /// When the export started.
    pub exported_at: DateTime<Utc>,
    /// Where the runs came from, free text (`sqlite:PATH`, `postgres:HOST/DB`).
    pub source: String,
}

impl ArchiveHeader {
    /// A header for an export from `source`, now.
    pub fn new(source: impl Into<String>) -> ArchiveHeader {
        ArchiveHeader {
            format: FORMAT.into(),
            version: VERSION,
            exported_at: Utc::now(),
            source: source.into(),
        }
    }

    /// Parse and check a header line. Errors name what is wrong: not JSON,
    /// another format, an unknown version.
    pub fn parse(line: &str) -> Result<ArchiveHeader, String> {
        let header: ArchiveHeader = serde_json::from_str(line)
            .map_err(|e| format!("the first line is not a glia-runs header: {e}"))?;
        if header.format != FORMAT {
            return Err(format!(
                "format is {:?}, expected {FORMAT:?}",
                header.format
            ));
        }
        if !(1..=VERSION).contains(&header.version) {
            return Err(format!(
                "version {} of {FORMAT} is not supported (this build reads versions 1 to {VERSION})",
                header.version
            ));
        }
        Ok(header)
    }
}

/// One run, whole.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunRecord {
    /// The run.
    pub run_id: Uuid,
    /// Owning tenant.
    pub tenant: String,
    /// Its per-tenant idempotency key, if it was admitted with one.
    pub idempotency_key: Option<String>,
    /// Its batch.
    pub batch_id: Option<Uuid>,
    /// When it was admitted.
    pub created_at: DateTime<Utc>,
    /// The whole log, seq 1 first.
    pub events: Vec<Event>,
    /// Its approvals, oldest first.
    pub approvals: Vec<ApprovalRecord>,
    /// Its inbox, oldest first.
    pub inbox: Vec<InboxRecord>,
    /// Labels given at submission ([`crate::RunSummary::tags`]); absent in
    /// archives written before runs had them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
    /// String pairs given at submission ([`crate::RunSummary::metadata`]).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub metadata: std::collections::BTreeMap<String, String>,
    /// The batch item's `custom_id` ([`crate::RunSummary::custom_id`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub custom_id: Option<String>,
    /// When and by whom its content was erased (version 2): its events,
    /// approvals and inbox are then tombstones, and an import keeps it so
    /// (whatever the file holds, an erased record's content is erased
    /// again on import: [`RunRecord::erased_content`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub erased: Option<Erasure>,
    /// A child run's parent (version 3; [`crate::RunSummary::parent_run_id`]).
    /// The parent need not be in the same file, nor imported first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_run_id: Option<Uuid>,
    /// The parent's call that started it (version 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_call_id: Option<String>,
    /// Its depth: 0 for a run a client started (version 3).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub depth: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// A run's erasure ([`crate::RunLog::erase_run`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Erasure {
    /// When.
    pub at: DateTime<Utc>,
    /// Who.
    pub by: String,
}

/// An approval of a [`RunRecord`] (the run and tenant are the record's).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApprovalRecord {
    /// The call.
    pub call_id: String,
    /// Tool name.
    pub tool: String,
    /// Arguments to approve.
    pub input: Value,
    /// Hash a decision must quote.
    pub args_hash: String,
    /// `pending` or `decided`.
    pub status: ApprovalStatus,
    /// When it was requested.
    pub requested_at: DateTime<Utc>,
    /// Its deadline, if any.
    pub expires_at: Option<DateTime<Utc>>,
    /// Handed to a second line of approvers.
    pub escalated: bool,
    /// Asks about a call a crash interrupted.
    pub interrupted: bool,
}

/// An inbox item of a [`RunRecord`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InboxRecord {
    /// The payload.
    pub payload: Payload,
    /// Its dedupe key ([`crate::dedupe_key`]).
    pub dedupe_key: Option<String>,
    /// Already applied to the run.
    pub consumed: bool,
}

impl ApprovalRecord {
    /// The approval an `approval.requested` event asks for (pending); `None`
    /// for any other event.
    pub fn requested(e: &Event) -> Option<ApprovalRecord> {
        match &e.kind {
            glia_proto::EventKind::ApprovalRequested {
                call_id,
                tool,
                input,
                args_hash,
                expires_at,
                interrupted,
            } => Some(ApprovalRecord {
                call_id: call_id.clone(),
                tool: tool.clone(),
                input: input.clone(),
                args_hash: args_hash.clone(),
                status: ApprovalStatus::Pending,
                requested_at: e.at,
                expires_at: *expires_at,
                escalated: false,
                interrupted: *interrupted,
            }),
            _ => None,
        }
    }

    /// The index row of this approval of `run_id` (of `tenant`).
    pub fn into_row(self, run_id: Uuid, tenant: String) -> crate::ApprovalRow {
        crate::ApprovalRow {
            run_id,
            tenant,
            call_id: self.call_id,
            tool: self.tool,
            input: self.input,
            args_hash: self.args_hash,
            status: self.status,
            requested_at: self.requested_at,
            expires_at: self.expires_at,
            escalated: self.escalated,
            interrupted: self.interrupted,
        }
    }
}

impl From<crate::ApprovalRow> for ApprovalRecord {
    fn from(a: crate::ApprovalRow) -> ApprovalRecord {
        ApprovalRecord {
            call_id: a.call_id,
            tool: a.tool,
            input: a.input,
            args_hash: a.args_hash,
            status: a.status,
            requested_at: a.requested_at,
            expires_at: a.expires_at,
            escalated: a.escalated,
            interrupted: a.interrupted,
        }
    }
}

impl RunRecord {
    /// The run's state after its events. Errors ([`LogError::Invalid`]): no
    /// events, an event of another run, sequences not 1, 2, 3 …, events that
    /// do not apply.
    pub fn validate(&self) -> Result<RunState, LogError> {
        let invalid = |reason: String| LogError::Invalid {
            run_id: self.run_id,
            reason,
        };
        if self.events.is_empty() {
            return Err(invalid("no events".into()));
        }
        for (i, e) in self.events.iter().enumerate() {
            if e.run_id != self.run_id {
                return Err(invalid(format!("event {} is of run {}", e.seq, e.run_id)));
            }
            if e.seq != i as u64 + 1 {
                return Err(invalid(format!(
                    "event at position {} has seq {}",
                    i + 1,
                    e.seq
                )));
            }
        }
        RunState::replay(self.run_id, &self.events).map_err(|e| match &self.erased {
            Some(erased) => invalid(format!(
                "the run was erased at {} by {}, and its tombstoned log does not replay: {e}",
                erased.at, erased.by
            )),
            None => invalid(format!("the log does not replay: {e}")),
        })
    }

    /// This record with its content erased when it is marked
    /// [`RunRecord::erased`] (events, approvals' arguments, inbox payloads
    /// as tombstones; idempotent), else as it is. What an import writes.
    pub fn erased_content(&self) -> RunRecord {
        if self.erased.is_none() {
            return self.clone();
        }
        let mut run = self.clone();
        run.events = run.events.iter().map(Event::erased).collect();
        for a in &mut run.approvals {
            a.input = glia_proto::erasure::erased_value();
            a.args_hash = glia_proto::erasure::erased_args_hash();
        }
        for i in &mut run.inbox {
            i.payload = i.payload.erased();
        }
        run
    }

    /// True when the run has work a worker should be woken for: not done,
    /// and runnable or with unapplied inbox items (what
    /// [`crate::Outbox::orphaned`] looks for).
    pub fn has_work(&self, state: &RunState) -> bool {
        let status = crate::RunStatus::of(state);
        status != crate::RunStatus::Done
            && (status == crate::RunStatus::Runnable || self.payload_waits())
    }

    /// The job an import writes for the run in `state` (its state after the
    /// record's events): none without work ([`RunRecord::has_work`]); a
    /// resume when a payload waits in its inbox; else a start.
    pub fn job(&self, state: &RunState) -> Option<crate::Job> {
        self.has_work(state).then(|| crate::Job {
            run_id: self.run_id,
            head_seq: state.head_seq,
            resume: self.payload_waits(),
        })
    }

    /// True when an inbox item is not consumed yet.
    fn payload_waits(&self) -> bool {
        self.inbox.iter().any(|i| !i.consumed)
    }
}

/// What [`Archive::import_run`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Imported {
    /// The run was written (and a job, when it has work).
    Created,
    /// The run was already there at the same head; nothing written.
    AlreadyPresent,
}

/// An event log whose runs can be exported and imported whole.
#[async_trait]
pub trait Archive: EventLog {
    /// One run, read in one snapshot. Errors: [`LogError::NotFound`].
    async fn export_run(&self, run_id: Uuid) -> Result<RunRecord, LogError>;

    /// Write a run exported elsewhere, in one transaction: its row (no lease),
    /// events, approvals, inbox, and a job when it has work
    /// ([`RunRecord::has_work`]). Errors: [`LogError::Invalid`] (see
    /// [`RunRecord::validate`]; also an idempotency key the tenant already
    /// uses for another run, or a batch of another tenant);
    /// [`LogError::Conflict`] when the run exists at another head.
    async fn import_run(&self, run: &RunRecord) -> Result<Imported, LogError>;
}
