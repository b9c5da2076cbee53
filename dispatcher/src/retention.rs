//! Erasure and retention: erasing a finished run's content on request
//! ([`erase`], behind `DELETE /v1/runs/{id}`) and after each tenant's
//! retention period ([`sweep_once`], looped by [`retention`]).
//!
//! Erasing is the run store's ([`glia_backends::RunLog::erase_run`]):
//! the log keeps every event as a tombstone, so counts, kinds, times, usage
//! and cost stay. Here it is joined by the ledger's side (held tool results,
//! [`glia_backends::Ledger::forget_run`]) and counted. Every step is
//! idempotent, so any number of dispatchers may sweep at once: two erasing
//! the same run write once, and the second finds it erased.

use std::time::Duration;

use chrono::{DateTime, SubsecRound, Utc};
use glia_backends::{ExpiredFilter, LogError, RunSummary};
use uuid::Uuid;

use crate::app::App;
pub use crate::config::Retention;
use crate::error::ApiError;

/// Who the sweeper records as `erased_by`.
pub const RETENTION_BY: &str = "retention";

/// Erase run `run_id`'s content for `by` (see
/// [`glia_backends::RunLog::erase_run`]), then forget what the ledger
/// holds for it (and, in the in-memory twin, the batch item's goal).
/// Answers the run's summary (`erased_at` set). Idempotent:
/// a run already erased answers as it is, its ledger forgotten again.
///
/// Errors: `run_not_found`, `run_not_finished` (cancel it first),
/// `run_leased` (a worker is still letting it go), `log_unavailable`,
/// `ledger_unavailable` (the log is erased; asking again forgets the rest).
pub async fn erase(app: &App, run_id: Uuid, by: &str) -> Result<RunSummary, ApiError> {
    // To the microsecond, as Postgres keeps it: the answer's `erased_at`
    // equals `at` exactly when this call erased the run.
    let at = Utc::now().trunc_subsecs(6);
    let run = app.log.erase_run(run_id, by, at).await?;
    app.ledger.forget_run(run_id).await?;
    if let Some(store) = &app.batches.store {
        store.forget_run(run_id).await?;
    }
    if run.erased_at == Some(at) {
        app.metrics().runs_erased.inc();
        tracing::info!(%run_id, tenant = %run.tenant, by, "run content erased");
    }
    Ok(run)
}

/// One sweep at `now`: for each tenant with a period (and the default for
/// the rest), up to [`Retention::per_sweep`] finished runs whose last event
/// is older than the period are erased as [`RETENTION_BY`]. A run another
/// dispatcher erased meanwhile, or one a worker still holds, is skipped.
/// Returns how many runs this sweep erased. Log lines name runs and
/// tenants, never content.
pub async fn sweep_once(app: &App, now: DateTime<Utc>) -> Result<usize, LogError> {
    let retention = &app.retention;
    let mut scopes: Vec<ExpiredFilter> = Vec::new();
    for (tenant, period) in &retention.tenants {
        scopes.push(ExpiredFilter {
            tenant: Some(tenant.clone()),
            except_tenants: Vec::new(),
            finished_before: before(now, *period),
            limit: retention.per_sweep,
        });
    }
    if let Some(period) = retention.default {
        scopes.push(ExpiredFilter {
            tenant: None,
            except_tenants: retention.tenants.keys().cloned().collect(),
            finished_before: before(now, period),
            limit: retention.per_sweep,
        });
    }
    let mut erased = 0;
    for filter in scopes {
        for run_id in app.log.expired_runs(&filter).await? {
            match erase(app, run_id, RETENTION_BY).await {
                Ok(_) => erased += 1,
                Err(e) if e.status().is_client_error() => {
                    tracing::debug!(%run_id, code = e.code(), "retention: run skipped");
                }
                Err(e) => {
                    tracing::warn!(%run_id, code = e.code(), "retention: erasure failed; trying again next sweep");
                }
            }
        }
    }
    Ok(erased)
}

fn before(now: DateTime<Utc>, period: Duration) -> DateTime<Utc> {
    chrono::Duration::from_std(period)
        .ok()
        .and_then(|p| now.checked_sub_signed(p))
        .unwrap_or(DateTime::<Utc>::MIN_UTC)
}

/// Sweep forever, every [`Retention::every`], while some tenant has a
/// period; a failed sweep is logged and counted and tried again next time.
/// Never returns; abort the task to stop it.
pub async fn retention(app: App) {
    if !app.retention.is_active() {
        return;
    }
    loop {
        match sweep_once(&app, Utc::now()).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(erased = n, "retention sweep"),
            Err(e) => {
                app.metrics().retention_errors.inc();
                tracing::warn!("retention sweep failed: {e}");
            }
        }
        tokio::time::sleep(app.retention.every).await;
    }
}
