//! The shapes of `/v1/schedules`: a schedule's definition (the body of
//! `POST /v1/schedules`), a patch, the view with its next fire times, a
//! page, a backfill and its answer. See [`crate::schedules`].

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use glia_proto::RunConfig;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

use crate::docs::RunConfigDoc;
use crate::model::Documented;

/// What a firing does when the run the schedule started last has not ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Overlap {
    /// Start nothing for this fire time (the default).
    #[default]
    Skip,
    /// Remember one fire time and start it when the last run ends; fire
    /// times while one is remembered are skipped.
    BufferOne,
    /// Start it anyway.
    AllowAll,
    /// Cancel the last run (as `POST /v1/runs/{id}/cancel`), then start it.
    CancelPrevious,
}

impl Overlap {
    /// `skip`, `buffer_one`, `allow_all` or `cancel_previous`.
    pub fn as_str(self) -> &'static str {
        match self {
            Overlap::Skip => "skip",
            Overlap::BufferOne => "buffer_one",
            Overlap::AllowAll => "allow_all",
            Overlap::CancelPrevious => "cancel_previous",
        }
    }
}

/// A schedule's definition: body of `POST /v1/schedules` (the `definition`
/// of a [`ScheduleView`]). Exactly one of `cron` and `interval_ms`; exactly
/// one of `agent` and `config` (an empty `config` when neither).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSchedule {
    /// Unique within the tenant: 1 to 64 bytes of ASCII letters, digits and
    /// `_ - . : / @`.
    #[schema(pattern = "^[A-Za-z0-9_.:/@-]{1,64}$")]
    pub name: String,
    /// A cron expression: 5 fields (minute hour day-of-month month
    /// day-of-week) or 6 (a leading seconds field), as the `croner` crate
    /// reads them (`*/15 * * * *`, `0 30 9 * * MON-FRI`, `0 0 L * *`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cron: Option<String>,
    /// The IANA time zone a `cron` expression is read in
    /// (`Europe/Berlin`); default `UTC`. Only with `cron`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_zone: Option<String>,
    /// Instead of `cron`: fire every this many milliseconds, at least 1,000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1000, maximum = 31622400000_u64)]
    pub interval_ms: Option<u64>,
    /// With `interval_ms`: the fire times are `anchor + k × interval_ms`
    /// (RFC 3339; default 1970-01-01T00:00:00Z, so an hourly interval fires
    /// on the hour, UTC).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub anchor: Option<DateTime<Utc>>,
    /// A registered agent of the tenant's (its name) each firing starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^[a-z0-9][a-z0-9_-]{0,63}$")]
    pub agent: Option<String>,
    /// The agent's version (from 1); without it each firing takes the
    /// latest version at that time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 4294967295_u64)]
    pub agent_version: Option<u32>,
    /// Instead of `agent`: the run's configuration (as in `POST /v1/runs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<RunConfigDoc>)]
    pub config: Option<RunConfig>,
    /// The goal of each run: a template where `{{ fire_time }}` (the
    /// nominal fire time, RFC 3339 UTC), `{{ fire_time_local }}` (the same
    /// in the schedule's zone), `{{ schedule }}` (its name) and
    /// `{{ schedule_id }}` are replaced; any other name is refused.
    #[schema(
        pattern = "[^\\t\\n\\u000b\\f\\r \\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]"
    )] // crate::docs::NOT_BLANK
    pub goal: String,
    /// Each run's tags (as in `POST /v1/runs`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schema(max_items = 20, value_type = Vec<String>)]
    pub tags: Vec<String>,
    /// Each run's metadata (as in `POST /v1/runs`, at most 18 keys): the
    /// scheduler adds `schedule_id` and `fire_time`, which it may not name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schema(value_type = BTreeMap<String, String>)]
    pub metadata: BTreeMap<String, String>,
    /// What a firing does while the last run has not ended (default `skip`).
    #[serde(default)]
    pub overlap: Overlap,
    /// After downtime, a fire time whose due time (nominal + jitter) is
    /// more than this many milliseconds ago is skipped; within it, it fires
    /// (per `overlap`). Default 60,000; 1,000 to 31,622,400,000 (a year).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1000, maximum = 31622400000_u64)]
    pub catch_up_window_ms: Option<u64>,
    /// Each firing is delayed by a deterministic 0 to `jitter_ms`
    /// milliseconds (a hash of the schedule and the nominal fire time, the
    /// same on every dispatcher). Default 0; at most 3,600,000 (an hour),
    /// and less than `interval_ms`.
    #[serde(default, skip_serializing_if = "is_zero")]
    #[schema(minimum = 0, maximum = 3600000)]
    pub jitter_ms: u64,
    /// Created paused (default false).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Body of `PATCH /v1/schedules/{id}`: the fields given replace the
/// definition's (`null` or absent: unchanged). Naming `cron` drops
/// `interval_ms` and `anchor`; naming `interval_ms` drops `cron` and
/// `time_zone`; naming `config` drops `agent` and `agent_version`; naming
/// `agent` drops `config` (and `agent_version` unless given). The result is
/// checked as `POST /v1/schedules` checks a body. A change of the timing
/// (`cron`, `time_zone`, `interval_ms`, `anchor`) counts fire times from
/// now on.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PatchSchedule {
    /// As in [`CreateSchedule`].
    #[schema(pattern = "^[A-Za-z0-9_.:/@-]{1,64}$")]
    pub name: Option<String>,
    /// As in [`CreateSchedule`].
    pub cron: Option<String>,
    /// As in [`CreateSchedule`].
    pub time_zone: Option<String>,
    /// As in [`CreateSchedule`].
    #[schema(minimum = 1000, maximum = 31622400000_u64)]
    pub interval_ms: Option<u64>,
    /// As in [`CreateSchedule`].
    pub anchor: Option<DateTime<Utc>>,
    /// As in [`CreateSchedule`].
    #[schema(pattern = "^[a-z0-9][a-z0-9_-]{0,63}$")]
    pub agent: Option<String>,
    /// As in [`CreateSchedule`].
    #[schema(minimum = 1, maximum = 4294967295_u64)]
    pub agent_version: Option<u32>,
    /// As in [`CreateSchedule`].
    #[schema(value_type = Option<RunConfigDoc>)]
    pub config: Option<RunConfig>,
    /// As in [`CreateSchedule`].
    #[schema(
        pattern = "[^\\t\\n\\u000b\\f\\r \\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]"
    )] // crate::docs::NOT_BLANK
    pub goal: Option<String>,
    /// As in [`CreateSchedule`].
    #[schema(max_items = 20)]
    pub tags: Option<Vec<String>>,
    /// As in [`CreateSchedule`].
    pub metadata: Option<BTreeMap<String, String>>,
    /// As in [`CreateSchedule`].
    pub overlap: Option<Overlap>,
    /// As in [`CreateSchedule`].
    #[schema(minimum = 1000, maximum = 31622400000_u64)]
    pub catch_up_window_ms: Option<u64>,
    /// As in [`CreateSchedule`].
    #[schema(minimum = 0, maximum = 3600000)]
    pub jitter_ms: Option<u64>,
}

/// One fire time: nominal (UTC and in the schedule's zone) and when it is
/// due (nominal + jitter).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, ToSchema)]
pub struct FireTime {
    /// The nominal fire time, UTC (the run's `fire_time` metadata).
    pub utc: DateTime<Utc>,
    /// The same instant in the schedule's zone (RFC 3339 with its offset).
    pub local: String,
    /// When the scheduler starts it: nominal + jitter.
    pub due_at: DateTime<Utc>,
}

/// A schedule as the API shows it.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, ToSchema)]
pub struct ScheduleView {
    /// Its id.
    pub id: Uuid,
    /// The tenant that owns it.
    pub tenant: String,
    /// Its name.
    pub name: String,
    /// Paused: it fires nothing.
    pub paused: bool,
    /// The definition, as created or patched (defaults filled in).
    pub definition: CreateSchedule,
    /// The last nominal fire time handled (or the time fire times count
    /// from: creation, unpause, a change of timing).
    pub last_fire_time: DateTime<Utc>,
    /// The run the last firing started.
    pub last_run_id: Option<Uuid>,
    /// A fire time waiting for the last run to end (`buffer_one`).
    pub buffered_fire_time: Option<DateTime<Utc>>,
    /// Why the last firing started no run.
    pub last_error: Option<String>,
    /// The next fire times (5 in `GET /v1/schedules/{id}`, none in lists
    /// and other answers; none while paused).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub next_fire_times: Vec<FireTime>,
    /// When it was created.
    pub created_at: DateTime<Utc>,
    /// When it was last written.
    pub updated_at: DateTime<Utc>,
}

/// A page of schedules, by id.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
pub struct SchedulePage {
    /// The schedules.
    pub schedules: Vec<ScheduleView>,
    /// Pass as `after` for the next page; absent on the last page.
    pub next: Option<Uuid>,
}

/// Query of `GET /v1/schedules`.
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ListSchedulesQuery {
    /// Cursor: the `next` of the previous page.
    pub after: Option<Uuid>,
    /// Page size, 1 to 1,000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<usize>,
}

/// Body of `POST /v1/schedules/{id}/backfill`: start one run per nominal
/// fire time `t` with `from <= t <= to` (at most
/// [`crate::schedules::MAX_BACKFILL`]; `to` not in the future).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BackfillBody {
    /// Start of the range, RFC 3339, inclusive.
    pub from: DateTime<Utc>,
    /// End of the range, RFC 3339, inclusive; not after now.
    pub to: DateTime<Utc>,
}

/// One run of a backfill.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, ToSchema)]
pub struct BackfillRun {
    /// The nominal fire time.
    pub fire_time: DateTime<Utc>,
    /// Its run.
    pub run_id: Uuid,
    /// False when the run existed already (this fire time had fired, or
    /// was backfilled before).
    pub created: bool,
}

/// Answer of `POST /v1/schedules/{id}/backfill`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, ToSchema)]
pub struct Backfilled {
    /// One per fire time in the range, in order.
    pub runs: Vec<BackfillRun>,
}

impl Documented for CreateSchedule {
    const SCHEMA: &'static str = "CreateSchedule";
}

impl Documented for PatchSchedule {
    const SCHEMA: &'static str = "PatchSchedule";
}

impl Documented for BackfillBody {
    const SCHEMA: &'static str = "BackfillBody";
}
