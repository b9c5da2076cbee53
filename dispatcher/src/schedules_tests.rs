//! Fire-time computation: cron with and without seconds, intervals, the
//! DST rule in `Europe/Berlin` (spring forward 2026-03-29, fall back
//! 2026-10-25), jitter, the goal template, and the catch-up window on the
//! in-memory twins.

use std::sync::{Arc, Mutex};

use chrono::{DateTime, Duration, Utc};
use glia_backends::memory::{MemoryLedger, MemoryLog, MemoryQueue};
use glia_backends::schedules::{MemorySchedules, Saved, Schedule, ScheduleStore};
use glia_backends::{RunFilter, RunLog};
use uuid::Uuid;

use super::*;
use crate::auth::Auth;

fn utc(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
}

fn def(cron: Option<&str>, zone: Option<&str>, interval_ms: Option<u64>) -> CreateSchedule {
    CreateSchedule {
        name: "nightly".into(),
        cron: cron.map(str::to_owned),
        time_zone: zone.map(str::to_owned),
        interval_ms,
        anchor: None,
        agent: None,
        agent_version: None,
        config: None,
        goal: "Reconcile the tickets of {{ fire_time }} ({{ fire_time_local }}), {{ schedule }}"
            .into(),
        tags: Vec::new(),
        metadata: Default::default(),
        overlap: Overlap::Skip,
        catch_up_window_ms: None,
        jitter_ms: 0,
        paused: false,
    }
}

fn cron(expr: &str, zone: Option<&str>) -> Timing {
    Timing::of(&def(Some(expr), zone, None)).unwrap()
}

fn times(t: &Timing, after: &str, n: usize) -> Vec<String> {
    t.next_n(utc(after), n).into_iter().map(rfc3339).collect()
}

fn field_of(e: ApiError) -> String {
    match e {
        ApiError::InvalidField { field, .. } => field,
        other => panic!("expected a 422 naming a field, got {other:?}"),
    }
}

#[test]
fn cron_without_seconds_fires_on_its_minutes() {
    let t = cron("*/15 * * * *", None);
    assert_eq!(
        times(&t, "2026-05-04T10:07:12Z", 3),
        [
            "2026-05-04T10:15:00Z",
            "2026-05-04T10:30:00Z",
            "2026-05-04T10:45:00Z"
        ]
    );
    // Strictly after: a fire time is not its own successor.
    assert_eq!(
        times(&t, "2026-05-04T10:15:00Z", 1),
        ["2026-05-04T10:30:00Z"]
    );
    let weekdays = cron("0 9 * * MON-FRI", Some("America/New_York"));
    // Friday 2026-05-08 09:00 EDT, then Monday.
    assert_eq!(
        times(&weekdays, "2026-05-08T12:00:00Z", 2),
        ["2026-05-08T13:00:00Z", "2026-05-11T13:00:00Z"]
    );
}

#[test]
fn cron_with_seconds_fires_on_its_seconds() {
    let t = cron("30 */5 * * * *", None);
    assert_eq!(
        times(&t, "2026-05-04T10:00:31Z", 2),
        ["2026-05-04T10:05:30Z", "2026-05-04T10:10:30Z"]
    );
    let every = cron("*/20 * * * * *", None);
    assert_eq!(
        times(&every, "2026-05-04T10:00:00Z", 3),
        [
            "2026-05-04T10:00:20Z",
            "2026-05-04T10:00:40Z",
            "2026-05-04T10:01:00Z"
        ]
    );
}

#[test]
fn bad_cron_expressions_and_zones_name_their_field() {
    for bad in [
        "61 * * * *",
        "* * *",
        "* * * * * * * *",
        "every day",
        "* * 32 * *",
    ] {
        let e = Timing::of(&def(Some(bad), None, None)).unwrap_err();
        assert_eq!(field_of(e), "cron", "{bad}");
    }
    let e = Timing::of(&def(Some("0 0 30 2 *"), None, None)).unwrap_err();
    assert!(
        e.to_string().contains("cron"),
        "February 30th never comes: {e}"
    );
    let e = Timing::of(&def(Some("0 * * * *"), Some("Mars/Olympus_Mons"), None)).unwrap_err();
    assert_eq!(field_of(e), "time_zone");
    let e = Timing::of(&def(Some("0 * * * *"), None, Some(60_000))).unwrap_err();
    assert_eq!(field_of(e), "interval_ms");
    let e = Timing::of(&def(None, None, None)).unwrap_err();
    assert_eq!(field_of(e), "cron");
    let e = Timing::of(&def(None, Some("UTC"), Some(60_000))).unwrap_err();
    assert_eq!(field_of(e), "time_zone");
    let e = Timing::of(&def(None, None, Some(999))).unwrap_err();
    assert_eq!(field_of(e), "interval_ms");
}

#[test]
fn intervals_count_from_their_anchor() {
    let mut d = def(None, None, Some(90_000));
    d.anchor = Some(utc("2026-01-01T00:00:00Z"));
    let t = Timing::of(&d).unwrap();
    assert_eq!(
        times(&t, "2026-01-01T00:01:40Z", 3),
        [
            "2026-01-01T00:03:00Z",
            "2026-01-01T00:04:30Z",
            "2026-01-01T00:06:00Z"
        ]
    );
    // Before the anchor too: the anchor is one fire time among others.
    assert_eq!(
        times(&t, "2025-12-31T23:58:00Z", 2),
        ["2025-12-31T23:58:30Z", "2026-01-01T00:00:00Z"]
    );
    // Milliseconds are kept.
    let mut d = def(None, None, Some(1_500));
    d.anchor = Some(utc("2026-01-01T00:00:00Z"));
    let t = Timing::of(&d).unwrap();
    assert_eq!(
        times(&t, "2026-01-01T00:00:00Z", 2),
        ["2026-01-01T00:00:01.500Z", "2026-01-01T00:00:03Z"]
    );
    // The default anchor is the epoch: hourly fires on the hour, UTC.
    let hourly = Timing::of(&def(None, None, Some(3_600_000))).unwrap();
    assert_eq!(
        times(&hourly, "2026-05-04T10:07:00Z", 1),
        ["2026-05-04T11:00:00Z"]
    );
}

/// Berlin springs forward on 2026-03-29: 02:00 CET becomes 03:00 CEST.
#[test]
fn spring_forward_a_fixed_time_in_the_gap_fires_once_right_after_it() {
    let t = cron("30 2 * * *", Some("Europe/Berlin"));
    assert_eq!(
        times(&t, "2026-03-27T12:00:00Z", 3),
        [
            "2026-03-28T01:30:00Z", // 02:30 CET
            "2026-03-29T01:00:00Z", // 03:00 CEST: the first instant after the gap
            "2026-03-30T00:30:00Z", // 02:30 CEST
        ]
    );
    assert_eq!(
        t.local(utc("2026-03-29T01:00:00Z")),
        "2026-03-29T03:00:00+02:00"
    );
}

#[test]
fn spring_forward_a_repeating_pattern_skips_the_times_that_do_not_exist() {
    let t = cron("0 * * * *", Some("Europe/Berlin"));
    let got = t.next_n(utc("2026-03-28T23:30:00Z"), 4);
    let local: Vec<String> = got.iter().map(|x| t.local(*x)).collect();
    assert_eq!(
        local,
        [
            "2026-03-29T01:00:00+01:00",
            "2026-03-29T03:00:00+02:00", // 02:00 does not exist
            "2026-03-29T04:00:00+02:00",
            "2026-03-29T05:00:00+02:00",
        ]
    );
    // In UTC: every hour of elapsed time, none twice.
    assert_eq!(
        got.iter().map(|x| rfc3339(*x)).collect::<Vec<_>>(),
        [
            "2026-03-29T00:00:00Z",
            "2026-03-29T01:00:00Z",
            "2026-03-29T02:00:00Z",
            "2026-03-29T03:00:00Z",
        ]
    );
}

/// Berlin falls back on 2026-10-25: 03:00 CEST becomes 02:00 CET.
#[test]
fn fall_back_a_fixed_time_fires_once_at_its_first_occurrence() {
    let t = cron("30 2 * * *", Some("Europe/Berlin"));
    assert_eq!(
        times(&t, "2026-10-24T12:00:00Z", 2),
        [
            "2026-10-25T00:30:00Z", // 02:30 CEST, the first 02:30
            "2026-10-26T01:30:00Z", // the next day's 02:30 CET; not 2026-10-25T01:30Z
        ]
    );
    // From between the two occurrences, the second is not a fire time.
    assert_eq!(
        times(&t, "2026-10-25T00:45:00Z", 1),
        ["2026-10-26T01:30:00Z"]
    );
}

#[test]
fn fall_back_a_repeating_pattern_fires_at_both_occurrences() {
    let t = cron("30 * * * *", Some("Europe/Berlin"));
    let got = t.next_n(utc("2026-10-24T23:00:00Z"), 4);
    assert_eq!(
        got.iter().map(|x| t.local(*x)).collect::<Vec<_>>(),
        [
            "2026-10-25T01:30:00+02:00",
            "2026-10-25T02:30:00+02:00",
            "2026-10-25T02:30:00+01:00",
            "2026-10-25T03:30:00+01:00",
        ]
    );
}

#[test]
fn jitter_is_deterministic_bounded_and_spread() {
    let id = Uuid::now_v7();
    let start = utc("2026-05-04T00:00:00Z");
    let mut seen = std::collections::BTreeSet::new();
    for i in 0..50 {
        let t = start + Duration::hours(i);
        let j = jitter(id, t, 30_000);
        assert_eq!(
            j,
            jitter(id, t, 30_000),
            "the same on every call (and dispatcher)"
        );
        assert!(
            j >= Duration::zero() && j <= Duration::milliseconds(30_000),
            "{j}"
        );
        seen.insert(j);
    }
    assert!(
        seen.len() > 40,
        "fire times spread: {} distinct of 50",
        seen.len()
    );
    assert_eq!(jitter(id, start, 0), Duration::zero());
    assert_ne!(
        (0..20)
            .map(|i| jitter(id, start + Duration::hours(i), 30_000))
            .collect::<Vec<_>>(),
        (0..20)
            .map(|i| jitter(Uuid::now_v7(), start + Duration::hours(i), 30_000))
            .collect::<Vec<_>>(),
        "another schedule spreads otherwise"
    );
    // Pinned: a jitter is a pure function of the key.
    let fixed = Uuid::parse_str("01890000-0000-7000-8000-000000000000").unwrap();
    let key = idempotency_key(fixed, start);
    assert_eq!(
        key,
        "schedule:01890000-0000-7000-8000-000000000000:2026-05-04T00:00:00Z"
    );
    let digest = Sha256::digest(key.as_bytes());
    let n = u64::from_be_bytes(digest[..8].try_into().unwrap()) % 30_001;
    assert_eq!(
        jitter(fixed, start, 30_000),
        Duration::milliseconds(n as i64)
    );
}

#[test]
fn the_goal_template_fills_four_names_and_refuses_others() {
    let d = def(Some("30 2 * * *"), Some("Europe/Berlin"), None);
    let t = Timing::of(&d).unwrap();
    let id = Uuid::now_v7();
    let goal = render_goal(&d, &t, id, utc("2026-03-29T01:00:00Z")).unwrap();
    assert_eq!(
        goal,
        "Reconcile the tickets of 2026-03-29T01:00:00Z (2026-03-29T03:00:00+02:00), nightly"
    );
    let mut bad = d.clone();
    bad.goal = "Run {{ fire_tim }}".into();
    let e = render_goal(&bad, &t, id, utc("2026-03-29T01:00:00Z")).unwrap_err();
    assert!(e.contains("fire_time, fire_time_local"), "{e}");
    bad.goal = "{{ '' }}".into();
    assert!(render_goal(&bad, &t, id, utc("2026-03-29T01:00:00Z")).is_err());
    let req = run_request(&d, &t, id, utc("2026-03-29T01:00:00Z")).unwrap();
    assert_eq!(req.metadata["schedule_id"], id.to_string());
    assert_eq!(req.metadata["fire_time"], "2026-03-29T01:00:00Z");
}

// ----- the scheduler on the in-memory twins ---------------------------------------------

struct Twin {
    log: Arc<MemoryLog>,
    store: Arc<MemorySchedules>,
    clock: Arc<Mutex<DateTime<Utc>>>,
    scheduler: Scheduler,
}

fn twin(start: DateTime<Utc>) -> Twin {
    let log = Arc::new(MemoryLog::default());
    let store = Arc::new(MemorySchedules::default());
    let app = App::new(
        log.clone(),
        Arc::new(MemoryQueue::default()),
        Arc::new(MemoryLedger::default()),
        Auth::open(),
    )
    .with_schedules(store.clone());
    let clock = Arc::new(Mutex::new(start));
    let read = clock.clone();
    let scheduler = Scheduler::new(&app)
        .unwrap()
        .with_clock(Arc::new(move || *read.lock().unwrap()));
    Twin {
        log,
        store,
        clock,
        scheduler,
    }
}

impl Twin {
    async fn add(&self, mut d: CreateSchedule) -> Schedule {
        let now = *self.clock.lock().unwrap();
        let id = Uuid::now_v7();
        d.catch_up_window_ms
            .get_or_insert(DEFAULT_CATCH_UP_WINDOW_MS);
        let timing = Timing::of(&d).unwrap();
        let s = Schedule {
            id,
            tenant: "t".into(),
            name: d.name.clone(),
            spec: serde_json::to_string(&d).unwrap(),
            paused: false,
            cursor: now,
            next_due_at: next_due(&timing, id, &d, now),
            last_run_id: None,
            buffered: None,
            last_error: None,
            revision: 0,
            created_at: now,
            updated_at: now,
        };
        match self.store.create(&s).await.unwrap() {
            Saved::Saved(s) => s,
            other => panic!("{other:?}"),
        }
    }

    async fn at(&self, t: &str) -> TickReport {
        *self.clock.lock().unwrap() = utc(t);
        self.scheduler.tick().await.unwrap()
    }

    async fn fire_times(&self) -> Vec<String> {
        let mut runs = self
            .log
            .list_runs(&RunFilter {
                limit: 1000,
                ..Default::default()
            })
            .await
            .unwrap();
        runs.sort_by_key(|r| r.metadata["fire_time"].clone());
        runs.iter()
            .map(|r| r.metadata["fire_time"].clone())
            .collect()
    }
}

#[tokio::test]
async fn after_downtime_fire_times_older_than_the_window_are_skipped() {
    let tw = twin(utc("2026-05-04T09:59:00Z"));
    let mut d = def(Some("0 * * * *"), None, None);
    d.overlap = Overlap::AllowAll;
    d.catch_up_window_ms = Some(2 * 3600 * 1000 + 60_000); // 2 h 1 min
    tw.add(d).await;
    let r = tw.at("2026-05-04T10:00:05Z").await;
    assert_eq!(r.created, 1);
    // Down from 10:00:05 to 14:30: 11:00 is 3.5 h old, 12:00 2.5 h (late),
    // 13:00 1.5 h and 14:00 0.5 h fire.
    let r = tw.at("2026-05-04T14:30:00Z").await;
    assert_eq!((r.created, r.late), (2, 2), "{r:?}");
    assert_eq!(
        tw.fire_times().await,
        [
            "2026-05-04T10:00:00Z",
            "2026-05-04T13:00:00Z",
            "2026-05-04T14:00:00Z"
        ]
    );
    // Nothing more until 15:00; again, nothing twice.
    assert_eq!(tw.at("2026-05-04T14:59:59Z").await.schedules, 0);
    let r = tw.at("2026-05-04T15:00:00Z").await;
    assert_eq!(r.created, 1);
    assert_eq!(tw.fire_times().await.len(), 4);
}

#[tokio::test]
async fn a_jittered_firing_waits_for_its_delay_and_keeps_its_nominal_time() {
    let tw = twin(utc("2026-05-04T09:59:00Z"));
    let mut d = def(Some("0 * * * *"), None, None);
    d.jitter_ms = 600_000;
    let s = tw.add(d).await;
    let nominal = utc("2026-05-04T10:00:00Z");
    let delay = jitter(s.id, nominal, 600_000);
    let due = nominal + delay;
    assert_eq!(s.next_due_at, Some(due));
    *tw.clock.lock().unwrap() = due - Duration::milliseconds(1);
    assert_eq!(tw.scheduler.tick().await.unwrap().created, 0);
    *tw.clock.lock().unwrap() = due;
    assert_eq!(tw.scheduler.tick().await.unwrap().created, 1);
    assert_eq!(tw.fire_times().await, ["2026-05-04T10:00:00Z"]);
}
