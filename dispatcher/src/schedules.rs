//! Schedules: runs started on a cron expression (in an IANA time zone) or
//! an interval, by every dispatcher's scheduler, each firing exactly once.
//!
//! | endpoint | scope | success | errors besides auth and bad input |
//! |---|---|---|---|
//! | `POST /v1/schedules` | submit | 201 schedule | 409 `schedule_exists`, 422 naming the field |
//! | `GET /v1/schedules` | any | 200 page | – |
//! | `GET /v1/schedules/{id}` | any | 200 schedule with its next 5 fire times | 404 `schedule_not_found` |
//! | `PATCH /v1/schedules/{id}` | submit | 200 schedule | 404, 409 `schedule_exists`, 422 |
//! | `DELETE /v1/schedules/{id}` | submit | 204 | 404 |
//! | `POST /v1/schedules/{id}/pause`, `/unpause` | submit | 200 schedule | 404 |
//! | `POST /v1/schedules/{id}/backfill` | submit | 200 the runs | 404, 422 naming `from`/`to` |
//!
//! Another tenant's schedule answers exactly like a missing one (404
//! `schedule_not_found`); an admin sees every tenant's. Every endpoint
//! answers 404 `not_available` on a dispatcher without a schedule store.
//!
//! **Fire times.** A `cron` expression has 5 fields, or 6 with seconds
//! first, and is read by the `croner` crate in the schedule's `time_zone`
//! (`chrono-tz`, default UTC). An interval fires at `anchor + k ×
//! interval_ms` (default anchor: the Unix epoch). The rule at daylight
//! saving changes is croner's, stated here so it is ours:
//!
//! - *Spring forward* (a gap: in `Europe/Berlin` on 2026-03-29 the clock
//!   jumps from 02:00 to 03:00). A pattern with a single fixed second,
//!   minute and hour (`30 2 * * *`) whose time falls in the gap fires at
//!   the first instant after the gap (03:00 CEST), once. A pattern that
//!   repeats within the day (`*/15 * * * *`, `0 * * * *`, `0 1-3 * * *`)
//!   fires only at wall-clock times that exist: those inside the gap do not
//!   occur.
//! - *Fall back* (a repeat: on 2026-10-25 02:00–03:00 occurs twice). A
//!   fixed-time pattern fires once, at the first occurrence (02:30 CEST,
//!   not 02:30 CET). A repeating pattern fires at both occurrences (every
//!   hour stays every hour of elapsed time).
//!
//! **Firing.** The scheduler ([`Scheduler`], one per dispatcher,
//! [`schedules`]) ticks every [`TICK`]: for each schedule due it takes the
//! nominal fire times after its cursor whose due time (nominal + jitter,
//! [`jitter`]) has come, in order, and starts each through
//! `crate::admission::admit_run` (the path of `POST /v1/runs`, every
//! config check included) with the idempotency key
//! `schedule:{id}:{nominal fire time, RFC 3339 UTC}` ([`idempotency_key`])
//! and the metadata `schedule_id` and `fire_time`: however many
//! dispatchers run and however often they restart, a fire time creates one
//! run. The cursor then moves by compare-and-set
//! ([`glia_backends::schedules::ScheduleStore::save`]): a dispatcher that
//! lost the race reads the schedule again and finds nothing left to do.
//!
//! **Overlap** (the last run started has not ended): `skip` starts
//! nothing; `buffer_one` remembers the fire time (one; later ones are
//! skipped while it waits) and starts it when the last run ends;
//! `allow_all` starts it anyway; `cancel_previous` cancels the last run
//! (as `POST /v1/runs/{id}/cancel`) and starts it.
//!
//! **Catch-up.** A fire time whose due time is more than
//! `catch_up_window_ms` ago when a scheduler gets to it (every dispatcher
//! was down) is skipped; later ones fire per the overlap policy.
//!
//! **Pause, edits, backfill.** A paused schedule fires nothing, and
//! unpausing counts fire times from then on (what fell in the pause is not
//! caught up). A change of the timing does the same. A backfill starts one
//! run per nominal fire time in `[from, to]` (at most [`MAX_BACKFILL`],
//! `to` not in the future) with the same idempotency keys, whatever the
//! overlap policy, and moves no cursor. See `docs/schedules.md`.

use std::sync::Arc;
use std::time::Duration as StdDuration;

use chrono::{DateTime, Duration, SecondsFormat, Utc};
use chrono_tz::Tz;
use croner::Cron;
use croner::parser::{CronParser, Seconds};
use glia_backends::schedules::{Saved, Schedule, ScheduleStore, is_due};
use glia_backends::{LogError, RunFilter, RunStatus};
use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::admission::{admit_run, run_config, screen_input};
use crate::app::App;
use crate::control::cancel_run;
use crate::error::ApiError;
use crate::model::CreateRun;
pub use crate::model::schedules::*;

/// Most fire times one backfill starts.
pub const MAX_BACKFILL: usize = 100;
/// Fire times `GET /v1/schedules/{id}` shows.
pub const NEXT_FIRE_TIMES: usize = 5;
/// `catch_up_window_ms` when a schedule gives none: one minute.
pub const DEFAULT_CATCH_UP_WINDOW_MS: u64 = 60_000;
/// Smallest and largest `catch_up_window_ms` (a second; a leap year).
pub const CATCH_UP_WINDOW_MS: std::ops::RangeInclusive<u64> = 1_000..=31_622_400_000;
/// Largest `jitter_ms`: an hour.
pub const MAX_JITTER_MS: u64 = 3_600_000;
/// Smallest and largest `interval_ms` (a second; a leap year).
pub const INTERVAL_MS: std::ops::RangeInclusive<u64> = 1_000..=31_622_400_000;
/// How often [`schedules`] ticks.
pub const TICK: StdDuration = StdDuration::from_secs(1);
/// Most fire times one schedule handles in one tick (the rest wait for the
/// next).
pub const PER_TICK: usize = 100;
/// Most late fire times one tick counts before it jumps over the rest.
pub const MAX_LATE_COUNTED: u64 = 10_000;
/// Most schedules one tick reads.
pub const DUE_PER_TICK: usize = 500;
/// Metadata keys the scheduler sets on every run it starts.
pub const RESERVED_METADATA: [&str; 2] = ["schedule_id", "fire_time"];

/// The schedule store, or 404 `not_available`.
pub(crate) fn store(app: &App) -> Result<&Arc<dyn ScheduleStore>, ApiError> {
    app.schedules.as_ref().ok_or_else(|| {
        ApiError::NotAvailable(
            "schedules are not available on this dispatcher (it has no schedule store)".into(),
        )
    })
}

fn invalid(field: &str, reason: impl Into<String>) -> ApiError {
    ApiError::InvalidField {
        field: field.to_owned(),
        reason: reason.into(),
    }
}

/// `t` as RFC 3339 in UTC with `Z`, fractions only when present
/// (`2026-03-29T01:00:00Z`).
pub fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::AutoSi, true)
}

/// The idempotency key of the run of schedule `id` at nominal fire time
/// `nominal`: `schedule:{id}:{RFC 3339 UTC}`.
pub fn idempotency_key(id: Uuid, nominal: DateTime<Utc>) -> String {
    format!("schedule:{id}:{}", rfc3339(nominal))
}

/// The delay of schedule `id`'s firing at `nominal`: 0 to `jitter_ms`
/// milliseconds from a SHA-256 of [`idempotency_key`], so every dispatcher
/// computes the same one, and different fire times spread.
pub fn jitter(id: Uuid, nominal: DateTime<Utc>, jitter_ms: u64) -> Duration {
    if jitter_ms == 0 {
        return Duration::zero();
    }
    let digest = Sha256::digest(idempotency_key(id, nominal).as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    let n = u64::from_be_bytes(first) % (jitter_ms + 1);
    Duration::milliseconds(i64::try_from(n).unwrap_or(0))
}

/// When a schedule's rule fires, parsed.
#[derive(Debug, Clone)]
pub enum Timing {
    /// A cron expression read in a time zone.
    Cron {
        /// The parsed expression.
        cron: Box<Cron>,
        /// Its zone.
        zone: Tz,
    },
    /// Every `every_ms` milliseconds from `anchor`.
    Interval {
        /// The period, ms (at least 1,000).
        every_ms: i64,
        /// A fire time; the others are whole periods away.
        anchor: DateTime<Utc>,
    },
}

impl Timing {
    /// The timing of `def` (`cron` + `time_zone`, or `interval_ms` +
    /// `anchor`). Errors: 422 naming the field, with the parser's reason.
    pub fn of(def: &CreateSchedule) -> Result<Timing, ApiError> {
        match (&def.cron, def.interval_ms) {
            (Some(_), Some(_)) => Err(invalid(
                "interval_ms",
                "cannot be combined with `cron`: give one of them",
            )),
            (None, None) => Err(invalid("cron", "give `cron` or `interval_ms`")),
            (Some(expr), None) => {
                if def.anchor.is_some() {
                    return Err(invalid("anchor", "only with `interval_ms`"));
                }
                let fields = expr.split_whitespace().count();
                if !(5..=6).contains(&fields) {
                    return Err(invalid(
                        "cron",
                        format!(
                            "{fields} fields; a cron expression has 5 (minute hour day-of-month month day-of-week) or 6 (seconds first)"
                        ),
                    ));
                }
                let cron = CronParser::builder()
                    .seconds(Seconds::Optional)
                    .build()
                    .parse(expr)
                    .map_err(|e| invalid("cron", e.to_string()))?;
                let zone: Tz = match &def.time_zone {
                    None => Tz::UTC,
                    Some(name) => name
                        .parse()
                        .map_err(|e| invalid("time_zone", format!("not an IANA time zone: {e}")))?,
                };
                let timing = Timing::Cron {
                    cron: Box::new(cron),
                    zone,
                };
                if timing.next_after(Utc::now()).is_none() {
                    return Err(invalid("cron", "never fires"));
                }
                Ok(timing)
            }
            (None, Some(ms)) => {
                if def.time_zone.is_some() {
                    return Err(invalid(
                        "time_zone",
                        "only with `cron` (an interval counts milliseconds)",
                    ));
                }
                if !INTERVAL_MS.contains(&ms) {
                    return Err(invalid(
                        "interval_ms",
                        format!(
                            "{ms}; from {} (a second) to {}",
                            INTERVAL_MS.start(),
                            INTERVAL_MS.end()
                        ),
                    ));
                }
                Ok(Timing::Interval {
                    every_ms: ms as i64,
                    anchor: def.anchor.unwrap_or(DateTime::UNIX_EPOCH),
                })
            }
        }
    }

    /// The first nominal fire time strictly after `after`; `None` when
    /// there is none (a cron expression that never matches again).
    pub fn next_after(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        match self {
            Timing::Cron { cron, zone } => cron
                .find_next_occurrence(&after.with_timezone(zone), false)
                .ok()
                .map(|t| t.with_timezone(&Utc)),
            Timing::Interval { every_ms, anchor } => {
                let every = i128::from(*every_ms) * 1000;
                let since = i128::from(after.timestamp_micros() - anchor.timestamp_micros());
                let k = since.div_euclid(every) + 1;
                let micros = i64::try_from(k * every).ok()?;
                anchor.checked_add_signed(Duration::microseconds(micros))
            }
        }
    }

    /// The first `n` nominal fire times strictly after `after`.
    pub fn next_n(&self, after: DateTime<Utc>, n: usize) -> Vec<DateTime<Utc>> {
        let mut out = Vec::with_capacity(n);
        let mut from = after;
        while out.len() < n {
            let Some(t) = self.next_after(from) else {
                break;
            };
            out.push(t);
            from = t;
        }
        out
    }

    /// `t` as the schedule's zone shows it (RFC 3339 with the zone's offset;
    /// UTC for an interval).
    pub fn local(&self, t: DateTime<Utc>) -> String {
        match self {
            Timing::Cron { zone, .. } => t
                .with_timezone(zone)
                .to_rfc3339_opts(SecondsFormat::AutoSi, false),
            Timing::Interval { .. } => rfc3339(t),
        }
    }
}

/// The goal of the firing at `nominal`: `def.goal` rendered (minijinja,
/// strict: an unknown name is an error) with `fire_time`,
/// `fire_time_local`, `schedule` and `schedule_id`. Errors: why it does not
/// render, or renders blank.
pub fn render_goal(
    def: &CreateSchedule,
    timing: &Timing,
    id: Uuid,
    nominal: DateTime<Utc>,
) -> Result<String, String> {
    let mut env = minijinja::Environment::new();
    env.set_undefined_behavior(minijinja::UndefinedBehavior::Strict);
    let ctx = minijinja::context! {
        fire_time => rfc3339(nominal),
        fire_time_local => timing.local(nominal),
        schedule => def.name.clone(),
        schedule_id => id.to_string(),
    };
    let goal = env.render_str(&def.goal, ctx).map_err(|e| {
        format!(
            "the template does not render ({e}); it may name fire_time, fire_time_local, schedule and schedule_id"
        )
    })?;
    if goal.trim().is_empty() {
        return Err("renders blank".into());
    }
    Ok(goal)
}

/// The `agent` of the run request: `name@version`, or `name` (its latest
/// version when the run is admitted).
fn agent_ref(def: &CreateSchedule) -> Option<String> {
    def.agent.as_ref().map(|name| match def.agent_version {
        Some(v) => format!("{name}@{v}"),
        None => name.clone(),
    })
}

/// The run request of the firing at `nominal`: as `POST /v1/runs` takes it.
/// Errors: the goal does not render (see [`render_goal`]).
pub fn run_request(
    def: &CreateSchedule,
    timing: &Timing,
    id: Uuid,
    nominal: DateTime<Utc>,
) -> Result<CreateRun, String> {
    let goal = render_goal(def, timing, id, nominal)?;
    let mut metadata = def.metadata.clone();
    metadata.insert("schedule_id".into(), id.to_string());
    metadata.insert("fire_time".into(), rfc3339(nominal));
    Ok(CreateRun {
        goal,
        config: def.config.clone().unwrap_or_default(),
        batch_id: None,
        agent: agent_ref(def),
        tags: def.tags.clone(),
        metadata,
        start_at: None,
        recorded_tools: None,
    })
}

/// True for a schedule name: 1 to 64 bytes of ASCII letters, digits and
/// `_ - . : / @`.
fn is_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-.:/@".contains(&b))
}

/// Check a definition of `tenant`'s as `POST /v1/schedules` does, filling
/// in defaults (`catch_up_window_ms`): its name, timing, bounds, and a run
/// request of its next fire time as `POST /v1/runs` checks one (goal,
/// config or the tenant's agent, tags, metadata, the operator's catalogue,
/// input guardrails). Writes nothing. Errors: 422 naming the field (an
/// agent the tenant lacks names `agent`).
pub async fn check(
    app: &App,
    tenant: &str,
    id: Uuid,
    def: &mut CreateSchedule,
) -> Result<Timing, ApiError> {
    if !is_name(&def.name) {
        return Err(invalid(
            "name",
            "must be 1 to 64 bytes of ASCII letters, digits and _ - . : / @",
        ));
    }
    let timing = Timing::of(def)?;
    let window = def.catch_up_window_ms.unwrap_or(DEFAULT_CATCH_UP_WINDOW_MS);
    if !CATCH_UP_WINDOW_MS.contains(&window) {
        return Err(invalid(
            "catch_up_window_ms",
            format!(
                "{window}; from {} to {}",
                CATCH_UP_WINDOW_MS.start(),
                CATCH_UP_WINDOW_MS.end()
            ),
        ));
    }
    def.catch_up_window_ms = Some(window);
    if def.jitter_ms > MAX_JITTER_MS {
        return Err(invalid(
            "jitter_ms",
            format!("{}; at most {MAX_JITTER_MS} (an hour)", def.jitter_ms),
        ));
    }
    if let Some(every) = def.interval_ms
        && def.jitter_ms >= every
    {
        return Err(invalid(
            "jitter_ms",
            format!("{}; must be less than interval_ms ({every})", def.jitter_ms),
        ));
    }
    if def.agent.is_some() && def.config.is_some() {
        return Err(invalid(
            "config",
            "cannot be combined with `agent` (the definition is the config)",
        ));
    }
    if def.agent_version.is_some() && def.agent.is_none() {
        return Err(invalid("agent_version", "only with `agent`"));
    }
    if let Some(v) = def.agent_version
        && v == 0
    {
        return Err(invalid("agent_version", "versions start at 1"));
    }
    for key in RESERVED_METADATA {
        if def.metadata.contains_key(key) {
            return Err(invalid(
                &format!("metadata.{key}"),
                "is set by the scheduler on every run",
            ));
        }
    }
    if def.metadata.len() > crate::admission::MAX_METADATA_KEYS - RESERVED_METADATA.len() {
        return Err(invalid(
            "metadata",
            format!(
                "{} keys; at most {} (the scheduler adds schedule_id and fire_time)",
                def.metadata.len(),
                crate::admission::MAX_METADATA_KEYS - RESERVED_METADATA.len()
            ),
        ));
    }
    let sample = timing.next_after(Utc::now()).unwrap_or_else(Utc::now);
    let req = run_request(def, &timing, id, sample).map_err(|reason| invalid("goal", reason))?;
    let config = run_config(app, tenant, &req).await.map_err(|e| match e {
        ApiError::AgentNotFound(agent) => invalid(
            "agent",
            format!("the tenant has no agent {agent} (register it with PUT /v1/agents/{{name}})"),
        ),
        other => other,
    })?;
    screen_input(&config, "goal", &req.goal)?;
    Ok(timing)
}

/// A stored schedule's definition and timing. Errors: 500
/// `corrupt_record` when the stored text does not parse.
pub fn definition(s: &Schedule) -> Result<(CreateSchedule, Timing), ApiError> {
    let def: CreateSchedule = serde_json::from_str(&s.spec).map_err(|e| {
        ApiError::from(LogError::Corrupt(format!(
            "schedule {} definition: {e}",
            s.id
        )))
    })?;
    let timing = Timing::of(&def)?;
    Ok((def, timing))
}

/// When schedule `id` (of `def`, `timing`) is next due after its cursor
/// `after`: the next nominal fire time plus its jitter.
pub fn next_due(
    timing: &Timing,
    id: Uuid,
    def: &CreateSchedule,
    after: DateTime<Utc>,
) -> Option<DateTime<Utc>> {
    timing
        .next_after(after)
        .map(|t| t + jitter(id, t, def.jitter_ms))
}

/// The API's view of `s`, with its next `n` fire times after `now` (none
/// while paused).
pub fn view(s: &Schedule, n: usize, now: DateTime<Utc>) -> Result<ScheduleView, ApiError> {
    let (mut def, timing) = definition(s)?;
    def.paused = s.paused;
    def.name = s.name.clone();
    let next_fire_times = if s.paused {
        Vec::new()
    } else {
        timing
            .next_n(s.cursor.max(now), n)
            .into_iter()
            .map(|t| FireTime {
                utc: t,
                local: timing.local(t),
                due_at: t + jitter(s.id, t, def.jitter_ms),
            })
            .collect()
    };
    Ok(ScheduleView {
        id: s.id,
        tenant: s.tenant.clone(),
        name: s.name.clone(),
        paused: s.paused,
        definition: def,
        last_fire_time: s.cursor,
        last_run_id: s.last_run_id,
        buffered_fire_time: s.buffered,
        last_error: s.last_error.clone(),
        next_fire_times,
        created_at: s.created_at,
        updated_at: s.updated_at,
    })
}

/// Start one run per nominal fire time of `s` in `[from, to]` (see the
/// module doc), through `admit_run` with the scheduler's idempotency
/// keys. Errors: 422 naming `to` (before `from`, in the future, more than
/// [`MAX_BACKFILL`] fire times), or what admission answers (nothing is
/// started after a refused fire time; earlier ones stay).
pub async fn backfill(
    app: &App,
    s: &Schedule,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Result<Vec<BackfillRun>, ApiError> {
    if to < from {
        return Err(invalid("to", "is before `from`"));
    }
    if to > now {
        return Err(invalid(
            "to",
            "is in the future (the scheduler starts future fire times)",
        ));
    }
    let (def, timing) = definition(s)?;
    let mut times = Vec::new();
    let mut after = from - Duration::microseconds(1);
    while let Some(t) = timing.next_after(after).filter(|t| *t <= to) {
        if times.len() == MAX_BACKFILL {
            return Err(invalid(
                "to",
                format!(
                    "the range holds more than {MAX_BACKFILL} fire times; backfill at most {MAX_BACKFILL} at once"
                ),
            ));
        }
        times.push(t);
        after = t;
    }
    let mut runs = Vec::with_capacity(times.len());
    for t in times {
        let req = run_request(&def, &timing, s.id, t).map_err(|reason| invalid("goal", reason))?;
        let (run, created) = admit(app, &s.tenant, s.id, t, &req).await?;
        runs.push(BackfillRun {
            fire_time: t,
            run_id: run,
            created,
        });
    }
    Ok(runs)
}

/// Admit the run of schedule `id` at `nominal`. A run of that fire time
/// admitted with another config (the agent's latest version moved between
/// two dispatchers' admissions) is that fire time's run all the same.
async fn admit(
    app: &App,
    tenant: &str,
    id: Uuid,
    nominal: DateTime<Utc>,
    req: &CreateRun,
) -> Result<(Uuid, bool), ApiError> {
    match admit_run(app, tenant, Some(idempotency_key(id, nominal)), req, None).await {
        Ok((run, created)) => Ok((run.run_id, created)),
        Err(ApiError::IdempotencyConflict(key)) => {
            let filter = RunFilter {
                tenant: Some(tenant.to_owned()),
                metadata: [
                    ("schedule_id".to_owned(), id.to_string()),
                    ("fire_time".to_owned(), rfc3339(nominal)),
                ]
                .into(),
                limit: 1,
                ..Default::default()
            };
            let found = app.log.list_runs(&filter).await?;
            match found.first() {
                Some(run) => Ok((run.run_id, false)),
                None => Err(ApiError::IdempotencyConflict(key)),
            }
        }
        Err(e) => Err(e),
    }
}

/// The clock a [`Scheduler`] reads: `Utc::now` in production, a simulated
/// one in tests.
pub type Now = Arc<dyn Fn() -> DateTime<Utc> + Send + Sync>;

/// What one [`Scheduler::tick`] did (counted by this scheduler: two
/// dispatchers that handled the same fire time both count it, but only one
/// created its run).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TickReport {
    /// Schedules looked at.
    pub schedules: u64,
    /// Runs this scheduler created.
    pub created: u64,
    /// Fire times whose run existed already (another dispatcher's).
    pub existed: u64,
    /// Fire times skipped by the overlap policy (`skip`, or `buffer_one`
    /// with a fire time already waiting).
    pub skipped: u64,
    /// Fire times skipped as later than the catch-up window.
    pub late: u64,
    /// Fire times remembered by `buffer_one`.
    pub buffered: u64,
    /// Last runs cancelled by `cancel_previous`.
    pub cancelled: u64,
    /// Fire times admission refused (recorded as the schedule's last error).
    pub refused: u64,
    /// Writes another writer beat (the schedule was read again).
    pub stale: u64,
}

/// One dispatcher's scheduler: [`Scheduler::tick`] fires what is due at its
/// clock's now. Several schedulers (dispatchers) may share a store.
#[derive(Clone)]
pub struct Scheduler {
    app: App,
    store: Arc<dyn ScheduleStore>,
    now: Now,
    /// Most fire times one schedule handles per tick (default [`PER_TICK`]).
    pub per_tick: usize,
}

impl Scheduler {
    /// The scheduler of `app`, reading `Utc::now`; `None` when the app has
    /// no schedule store.
    pub fn new(app: &App) -> Option<Scheduler> {
        Some(Scheduler {
            store: app.schedules.clone()?,
            app: app.clone(),
            now: Arc::new(Utc::now),
            per_tick: PER_TICK,
        })
    }

    /// The same scheduler reading `now` instead of the system clock.
    pub fn with_clock(mut self, now: Now) -> Scheduler {
        self.now = now;
        self
    }

    /// Fire what is due now: every due schedule (up to [`DUE_PER_TICK`]),
    /// each moved on by compare-and-set. A schedule whose firing failed for
    /// a store that did not answer keeps its progress up to the last fire
    /// time handled and is tried again at the next tick. Errors: the due
    /// schedules could not be read.
    pub async fn tick(&self) -> Result<TickReport, ApiError> {
        let now = (self.now)();
        let due = self.store.due(now, DUE_PER_TICK).await?;
        let mut report = TickReport::default();
        for s in due {
            report.schedules += 1;
            let id = s.id;
            if let Err(e) = self.advance(s, now, &mut report).await {
                tracing::warn!(schedule_id = %id, "schedule not advanced (tried again next tick): {e}");
            }
        }
        Ok(report)
    }

    /// Handle schedule `s` at `now` and save it; read it again and redo when
    /// another writer came first.
    async fn advance(
        &self,
        mut s: Schedule,
        now: DateTime<Utc>,
        report: &mut TickReport,
    ) -> Result<(), ApiError> {
        for _ in 0..4 {
            let mut next = s.clone();
            let worked = self.work(&mut next, now, report).await;
            if next == s {
                return worked;
            }
            next.updated_at = now;
            match self.store.save(&next).await? {
                Saved::Saved(_) => return worked,
                Saved::Stale | Saved::NameTaken => {
                    report.stale += 1;
                    match self.store.schedule(None, s.id).await? {
                        Some(fresh) if is_due(&fresh, now) => s = fresh,
                        _ => return worked,
                    }
                }
            }
        }
        Ok(())
    }

    /// The fire times of `next` due at `now`, handled in order (see the
    /// module doc); `next` records what was done, also when an error stops
    /// it.
    async fn work(
        &self,
        next: &mut Schedule,
        now: DateTime<Utc>,
        report: &mut TickReport,
    ) -> Result<(), ApiError> {
        let (def, timing) = match definition(next) {
            Ok(parsed) => parsed,
            Err(e) => {
                next.last_error = Some(format!("the definition does not parse: {e}"));
                next.next_due_at = None;
                return Ok(());
            }
        };
        let window = Duration::milliseconds(
            def.catch_up_window_ms
                .unwrap_or(DEFAULT_CATCH_UP_WINDOW_MS)
                .min(i64::MAX as u64) as i64,
        );
        // Fire times this far back are late whatever their jitter: counted
        // (up to a bound: a long downtime of a frequent schedule is jumped
        // over), never fired.
        let floor = now - window - Duration::milliseconds(def.jitter_ms as i64 + 1);
        let mut from = next.cursor;
        let mut late = 0u64;
        while from < floor && late < MAX_LATE_COUNTED {
            match timing.next_after(from) {
                Some(t) if t <= floor => {
                    late += 1;
                    from = t;
                    next.cursor = t;
                }
                _ => break,
            }
        }
        from = from.max(floor);
        if late > 0 {
            report.late += late;
            tracing::info!(schedule_id = %next.id, late, "fire times skipped: later than the catch-up window");
        }
        let result = async {
            if let Some(waiting) = next.buffered
                && !self.running(next.last_run_id).await?
            {
                self.start(next, &def, &timing, waiting, report).await?;
                next.buffered = None;
            }
            let mut handled = 0;
            while handled < self.per_tick {
                let Some(t) = timing.next_after(from) else {
                    break;
                };
                let due = t + jitter(next.id, t, def.jitter_ms);
                if due > now {
                    break;
                }
                handled += 1;
                if now - due > window {
                    report.late += 1;
                    tracing::info!(schedule_id = %next.id, fire_time = %rfc3339(t), "fire time skipped: later than the catch-up window");
                } else {
                    self.fire(next, &def, &timing, t, report).await?;
                }
                next.cursor = t;
                from = t;
            }
            Ok::<(), ApiError>(())
        }
        .await;
        next.next_due_at = next_due(&timing, next.id, &def, from);
        result
    }

    /// Fire `t` per the overlap policy.
    async fn fire(
        &self,
        next: &mut Schedule,
        def: &CreateSchedule,
        timing: &Timing,
        t: DateTime<Utc>,
        report: &mut TickReport,
    ) -> Result<(), ApiError> {
        let running = self.running(next.last_run_id).await?;
        match (def.overlap, running) {
            (_, false) | (Overlap::AllowAll, true) => {
                self.start(next, def, timing, t, report).await
            }
            (Overlap::Skip, true) => {
                report.skipped += 1;
                Ok(())
            }
            (Overlap::BufferOne, true) => {
                if next.buffered.is_none() {
                    next.buffered = Some(t);
                    report.buffered += 1;
                } else {
                    report.skipped += 1;
                }
                Ok(())
            }
            (Overlap::CancelPrevious, true) => {
                if let Some(previous) = next.last_run_id {
                    let reason = format!(
                        "schedule {} fires again at {} (overlap cancel_previous)",
                        next.name,
                        rfc3339(t)
                    );
                    match cancel_run(&self.app, previous, &reason, "scheduler").await {
                        Ok(_) => report.cancelled += 1,
                        Err(e) if e.status().is_client_error() => {}
                        Err(e) => return Err(e),
                    }
                }
                self.start(next, def, timing, t, report).await
            }
        }
    }

    /// True when run `last` exists and has not ended.
    async fn running(&self, last: Option<Uuid>) -> Result<bool, ApiError> {
        let Some(id) = last else {
            return Ok(false);
        };
        match self.app.log.get_run(id).await {
            Ok(run) => Ok(run.status != RunStatus::Done),
            Err(LogError::NotFound(_)) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Start the run of `t`; a refusal (4xx) is recorded as the schedule's
    /// last error and the fire time counts as handled.
    async fn start(
        &self,
        next: &mut Schedule,
        def: &CreateSchedule,
        timing: &Timing,
        t: DateTime<Utc>,
        report: &mut TickReport,
    ) -> Result<(), ApiError> {
        let refused = |next: &mut Schedule, report: &mut TickReport, why: String| {
            tracing::warn!(schedule_id = %next.id, fire_time = %rfc3339(t), "firing refused: {why}");
            next.last_error = Some(format!("fire time {}: {why}", rfc3339(t)));
            report.refused += 1;
        };
        let req = match run_request(def, timing, next.id, t) {
            Ok(req) => req,
            Err(why) => {
                refused(next, report, format!("goal: {why}"));
                return Ok(());
            }
        };
        match admit(&self.app, &next.tenant, next.id, t, &req).await {
            Ok((run, created)) => {
                next.last_run_id = Some(run);
                next.last_error = None;
                if created {
                    report.created += 1;
                } else {
                    report.existed += 1;
                }
                Ok(())
            }
            Err(e) if e.status().is_client_error() => {
                refused(next, report, e.to_string());
                Ok(())
            }
            Err(e) => Err(e),
        }
    }
}

/// The scheduler of a dispatcher: [`Scheduler::tick`] every [`TICK`],
/// forever. Spawned beside the relay and the reconciler on every
/// dispatcher that has a schedule store; returns at once without one.
pub async fn schedules(app: App) {
    let Some(scheduler) = Scheduler::new(&app) else {
        return;
    };
    loop {
        match scheduler.tick().await {
            Ok(report) if report.created > 0 => {
                tracing::info!(created = report.created, "schedules fired");
            }
            Ok(_) => {}
            Err(e) => tracing::warn!("schedules: the due schedules could not be read: {e}"),
        }
        tokio::time::sleep(TICK).await;
    }
}

#[cfg(test)]
#[path = "schedules_tests.rs"]
mod tests;
