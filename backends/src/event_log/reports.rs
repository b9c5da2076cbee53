//! Reads over the whole store rather than one run: a tenant's daily spend,
//! whether the store answers, and the fleet's gauges.
//!
//! # Contract
//!
//! - Every method only reads, and none is on a run's path except
//!   [`Reports::tenant_usage`], which rebuilds a missing budget counter
//!   ([`Ledger::seed`](crate::Ledger::seed)) from the events themselves.
//! - Counts are of the moment they are read; they may be stale by the time
//!   they are seen.

use async_trait::async_trait;
use chrono::{DateTime, NaiveDate, Utc};
use glia_proto::Spend;

use super::approvals::Approvals;
use super::runs::RunLog;
use crate::{ApprovalFilter, LogError, LogGauges, RunFilter, RunGaugeKey, RunStatus};

/// Tenant usage, readiness and gauges. See the [module](self) for the
/// contract.
#[async_trait]
pub trait Reports: RunLog + Approvals {
    /// What `tenant`'s runs spent on models during the UTC day `day`: the
    /// usage and cost of every `model.response`, `plan.draft` and
    /// `context.compacted` event (see [`Spend::of_event`]) whose time falls in
    /// `[day 00:00, next day 00:00)` UTC. Used to rebuild a missing budget
    /// counter ([`Ledger::seed`](crate::Ledger::seed)). An unknown tenant spent nothing.
    async fn tenant_usage(&self, tenant: &str, day: NaiveDate) -> Result<Spend, LogError>;

    /// True when the store answers.
    async fn ready(&self) -> Result<(), LogError>;

    /// Counts for the fleet's gauges at `now`: runs not done by status and
    /// pull point, pending approvals and those past their deadline. The default
    /// pages through [`RunLog::list_runs`] and [`Approvals::approvals`]
    /// (fine for the in-memory twin); the Postgres adapter counts in SQL.
    async fn gauges(&self, now: DateTime<Utc>) -> Result<LogGauges, LogError> {
        let mut g = LogGauges::default();
        let mut filter = RunFilter {
            limit: 1000,
            ..RunFilter::default()
        };
        loop {
            let page = self.list_runs(&filter).await?;
            for run in page.iter().filter(|r| r.status != RunStatus::Done) {
                *g.runs
                    .entry(RunGaugeKey::of(run.status, run.pull_point.as_ref()))
                    .or_default() += 1;
            }
            match page.last() {
                Some(last) if page.len() == filter.limit => filter.before = Some(last.run_id),
                _ => break,
            }
        }
        let pending = self
            .approvals(&ApprovalFilter {
                pending_only: true,
                limit: 1000,
                ..ApprovalFilter::default()
            })
            .await?;
        g.approvals_pending = pending.len() as u64;
        g.approvals_overdue = pending
            .iter()
            .filter(|a| a.expires_at.is_some_and(|t| t <= now))
            .count() as u64;
        g.oldest_approval_age_seconds = pending
            .iter()
            .map(|a| (now - a.requested_at).num_milliseconds().max(0) as f64 / 1000.0)
            .fold(0.0, f64::max);
        Ok(g)
    }
}
