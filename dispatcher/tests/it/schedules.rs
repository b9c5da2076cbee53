//! Schedules on the real Postgres store with two dispatchers' schedulers
//! sharing it and one simulated clock: over a simulated day every nominal
//! fire time creates exactly one run; both down across three fire times,
//! then catch-up per the window and each overlap policy; each overlap
//! policy in steady state with runs that stay running (no worker consumes
//! their start jobs) until the test finishes them; bad input (an invalid
//! cron expression or zone, an unknown field, an agent the tenant lacks)
//! answers 4xx naming the field with nothing created; the API (next fire
//! times, pause and unpause, patch, backfill, tenancy).

use crate::common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::http::{Method, StatusCode};
use chrono::{DateTime, Duration, DurationRound, Timelike, Utc};
use common::{ADMIN, APP_A, Reply, SUB_A, SUB_B, finish, send};
use glia_backends::memory::{MemoryLedger, MemoryQueue};
use glia_backends::postgres::PgLog;
use glia_backends::schedules::ScheduleStore;
use glia_backends::testkit::TestDb;
use glia_backends::{Inbox, RunFilter, RunLog, RunStatus, RunSummary};
use glia_dispatcher::schedules::{Scheduler, TickReport};
use glia_dispatcher::{App, router};
use glia_proto::Payload;
use serde_json::{Value, json};
use uuid::Uuid;

/// Two dispatchers over one Postgres database, one simulated clock.
struct Fleet {
    _db: TestDb,
    log: Arc<PgLog>,
    router: axum::Router,
    clock: Arc<Mutex<DateTime<Utc>>>,
    dispatchers: [Scheduler; 2],
}

async fn fleet() -> Fleet {
    let db = TestDb::new().await;
    let log = Arc::new(db.log().await);
    let clock = Arc::new(Mutex::new(Utc::now()));
    let dispatcher = || {
        App::new(
            log.clone(),
            Arc::new(MemoryQueue::default()),
            Arc::new(MemoryLedger::default()),
            common::auth(),
        )
        .with_schedules(log.clone())
    };
    let scheduler = |app: &App| {
        let read = clock.clone();
        Scheduler::new(app)
            .unwrap()
            .with_clock(Arc::new(move || *read.lock().unwrap()))
    };
    let (one, two) = (dispatcher(), dispatcher());
    Fleet {
        router: router(one.clone()),
        dispatchers: [scheduler(&one), scheduler(&two)],
        log,
        clock,
        _db: db,
    }
}

impl Fleet {
    async fn call(&self, method: Method, uri: &str, token: &str, body: Option<Value>) -> Reply {
        send(
            &self.router,
            common::request(method, uri, Some(token), body.as_ref()),
        )
        .await
    }

    async fn create(&self, body: Value) -> Uuid {
        let r = self
            .call(Method::POST, "/v1/schedules", SUB_A, Some(body))
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
        r.body["id"].as_str().unwrap().parse().unwrap()
    }

    /// Both dispatchers tick at `t`, concurrently.
    async fn tick(&self, t: DateTime<Utc>) -> TickReport {
        *self.clock.lock().unwrap() = t;
        let (a, b) = tokio::join!(self.dispatchers[0].tick(), self.dispatchers[1].tick());
        let (a, b) = (a.unwrap(), b.unwrap());
        TickReport {
            schedules: a.schedules + b.schedules,
            created: a.created + b.created,
            existed: a.existed + b.existed,
            skipped: a.skipped + b.skipped,
            late: a.late + b.late,
            buffered: a.buffered + b.buffered,
            cancelled: a.cancelled + b.cancelled,
            refused: a.refused + b.refused,
            stale: a.stale + b.stale,
        }
    }

    /// The runs of schedule `id`, by fire time (a fire time twice would
    /// show as a list of two).
    async fn runs(&self, id: Uuid) -> BTreeMap<String, Vec<RunSummary>> {
        let runs = self
            .log
            .list_runs(&RunFilter {
                metadata: [("schedule_id".to_owned(), id.to_string())].into(),
                limit: 1000,
                ..Default::default()
            })
            .await
            .unwrap();
        let mut by_time: BTreeMap<String, Vec<RunSummary>> = BTreeMap::new();
        for r in runs {
            by_time
                .entry(r.metadata["fire_time"].clone())
                .or_default()
                .push(r);
        }
        by_time
    }

    async fn run_at(&self, id: Uuid, fire_time: &str) -> RunSummary {
        let runs = self.runs(id).await;
        let at = runs
            .get(fire_time)
            .unwrap_or_else(|| panic!("no run at {fire_time}: {:?}", runs.keys()));
        assert_eq!(at.len(), 1, "one run at {fire_time}");
        at[0].clone()
    }

    async fn cancel_posted(&self, run: Uuid) -> bool {
        self.log
            .inbox(run)
            .await
            .unwrap()
            .iter()
            .any(|i| matches!(i.payload, Payload::Cancel { .. }))
    }
}

fn rfc(t: DateTime<Utc>) -> String {
    glia_dispatcher::schedules::rfc3339(t)
}

/// The next whole hour after now (and a second).
fn next_hour() -> DateTime<Utc> {
    (Utc::now() + Duration::seconds(1))
        .duration_trunc(Duration::hours(1))
        .unwrap()
        + Duration::hours(1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_dispatchers_over_a_simulated_day_start_every_fire_time_exactly_once() {
    let f = fleet().await;
    let cron = f
        .create(
            json!({"name": "half-hourly", "cron": "*/30 * * * *", "time_zone": "Europe/Berlin",
                       "goal": "Report for {{ fire_time_local }}", "overlap": "allow_all",
                       "jitter_ms": 90000, "catch_up_window_ms": 3600000, "tags": ["nightly"]}),
        )
        .await;
    let interval = f
        .create(json!({"name": "every-45-min", "interval_ms": 2700000, "goal": "Check at {{ fire_time }}",
                       "overlap": "allow_all", "catch_up_window_ms": 3600000}))
        .await;
    let start = Utc::now();
    let end = start + Duration::hours(24);
    // Step the clock over the day by 7 minutes and some seconds, both
    // dispatchers ticking at each step.
    let mut t = start;
    let mut total = TickReport::default();
    while t < end + Duration::minutes(10) {
        t += Duration::seconds(7 * 60 + 13);
        let r = f.tick(t).await;
        total.created += r.created;
        total.existed += r.existed;
        total.late += r.late;
        total.stale += r.stale;
    }
    let last = t;
    // Expected, computed apart from the scheduler: every :00 and :30 (the
    // Berlin offset is whole hours), every 45 minutes of the epoch.
    let mut expected_cron = Vec::new();
    let mut expected_interval = Vec::new();
    let mut m = start.duration_trunc(Duration::minutes(1)).unwrap() + Duration::minutes(1);
    while m <= last - Duration::minutes(2) {
        if m.minute().is_multiple_of(30) {
            expected_cron.push(rfc(m));
        }
        if m.timestamp() % 2700 == 0 {
            expected_interval.push(rfc(m));
        }
        m += Duration::minutes(1);
    }
    let cron_runs = f.runs(cron).await;
    let interval_runs = f.runs(interval).await;
    for (runs, expected) in [
        (&cron_runs, &expected_cron),
        (&interval_runs, &expected_interval),
    ] {
        for at in expected {
            assert_eq!(
                runs.get(at).map(Vec::len),
                Some(1),
                "fire time {at} has exactly one run"
            );
        }
        assert!(
            runs.values().all(|v| v.len() == 1),
            "no fire time twice: {:?}",
            runs.iter()
                .filter(|(_, v)| v.len() > 1)
                .map(|(k, _)| k)
                .collect::<Vec<_>>()
        );
    }
    assert!(expected_cron.len() >= 48, "{}", expected_cron.len());
    assert!(expected_interval.len() >= 32, "{}", expected_interval.len());
    // Nothing beyond the expected (at most the fire times of the last minutes).
    assert!(cron_runs.len() <= expected_cron.len() + 1);
    assert!(interval_runs.len() <= expected_interval.len() + 1);
    assert_eq!(
        total.created as usize,
        cron_runs.len() + interval_runs.len(),
        "the two dispatchers together created each run once: {total:?}"
    );
    assert_eq!(total.late, 0, "{total:?}");
    // The runs carry the schedule's tags, metadata and rendered goal.
    let first = &cron_runs[&expected_cron[0]][0];
    assert_eq!(first.tenant, "a");
    assert_eq!(first.tags, ["nightly"]);
    assert_eq!(first.metadata["schedule_id"], cron.to_string());
    let events = f.log.events(first.run_id, 0, 1).await.unwrap();
    let glia_proto::EventKind::SessionStart { goal, .. } = &events[0].kind else {
        panic!("{events:?}")
    };
    assert!(
        goal.starts_with("Report for 20") && (goal.contains("+01:00") || goal.contains("+02:00")),
        "{goal}"
    );
}

/// Hourly schedules, one per overlap policy, catch-up window 2 h: the fire
/// time H0 starts a run that stays running; both dispatchers are down from
/// H0 to H3 + 30 min (three fire times: H1 2.5 h late is skipped, H2 and H3
/// are within the window and fire per the policy).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_dispatchers_down_across_three_fire_times_catch_up_per_window_and_policy() {
    let f = fleet().await;
    let mut ids = BTreeMap::new();
    for policy in ["skip", "buffer_one", "allow_all", "cancel_previous"] {
        let id = f
            .create(
                json!({"name": format!("hourly-{policy}"), "cron": "0 * * * *",
                           "goal": "Reconcile {{ fire_time }}", "overlap": policy,
                           "catch_up_window_ms": 7200000}),
            )
            .await;
        ids.insert(policy, id);
    }
    let h0 = next_hour();
    let h = |n: i64| rfc(h0 + Duration::hours(n));
    let r = f.tick(h0 + Duration::seconds(2)).await;
    assert_eq!(r.created, 4, "{r:?}");
    // Down across H1, H2, H3.
    let r = f
        .tick(h0 + Duration::hours(3) + Duration::minutes(30))
        .await;
    // H1 is late for each of the four (counted by each dispatcher that
    // handled the schedule before the other saved it).
    assert!((4..=8).contains(&r.late), "{r:?}");

    let runs = |id| f.runs(id);
    // skip: H0's run is still running: H2 and H3 start nothing.
    let skip = runs(ids["skip"]).await;
    assert_eq!(skip.keys().cloned().collect::<Vec<_>>(), [h(0)]);
    // allow_all: H2 and H3 both start.
    let all = runs(ids["allow_all"]).await;
    assert_eq!(all.keys().cloned().collect::<Vec<_>>(), [h(0), h(2), h(3)]);
    // cancel_previous: H2 cancels H0's run and starts; H3 cancels H2's and starts.
    let cancel = runs(ids["cancel_previous"]).await;
    assert_eq!(
        cancel.keys().cloned().collect::<Vec<_>>(),
        [h(0), h(2), h(3)]
    );
    assert!(f.cancel_posted(cancel[&h(0)][0].run_id).await);
    assert!(f.cancel_posted(cancel[&h(2)][0].run_id).await);
    assert!(!f.cancel_posted(cancel[&h(3)][0].run_id).await);
    // buffer_one: H2 waits (H3 is skipped: one is buffered already).
    let buffer = runs(ids["buffer_one"]).await;
    assert_eq!(buffer.keys().cloned().collect::<Vec<_>>(), [h(0)]);
    let stored = f
        .log
        .schedule(None, ids["buffer_one"])
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.buffered.map(rfc), Some(h(2)));
    // H0's run ends: the buffered H2 starts at the next tick, once.
    finish(&*f.log, buffer[&h(0)][0].run_id).await;
    let r = f
        .tick(h0 + Duration::hours(3) + Duration::minutes(31))
        .await;
    assert_eq!(r.created, 1, "{r:?}");
    let buffer = runs(ids["buffer_one"]).await;
    assert_eq!(buffer.keys().cloned().collect::<Vec<_>>(), [h(0), h(2)]);
    let stored = f
        .log
        .schedule(None, ids["buffer_one"])
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.buffered, None);
    assert_eq!(stored.last_run_id, Some(buffer[&h(2)][0].run_id));
    // Nothing fired twice anywhere.
    for id in ids.values() {
        assert!(runs(*id).await.values().all(|v| v.len() == 1));
    }
}

/// Each overlap policy in steady state, every 10 minutes, runs that stay
/// running until the test finishes them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_overlap_policy_with_a_run_still_running() {
    let f = fleet().await;
    let mut ids = BTreeMap::new();
    for policy in ["skip", "buffer_one", "allow_all", "cancel_previous"] {
        let id = f
            .create(
                json!({"name": format!("ten-{policy}"), "interval_ms": 600000,
                           "goal": "Poll at {{ fire_time }}", "overlap": policy}),
            )
            .await;
        ids.insert(policy, id);
    }
    let t0 = next_hour();
    let at = |n: i64| t0 + Duration::minutes(10 * n);
    let key = |n: i64| rfc(at(n));
    f.tick(at(0) + Duration::seconds(1)).await;
    f.tick(at(1) + Duration::seconds(1)).await;
    f.tick(at(2) + Duration::seconds(1)).await;
    let keys = |m: &BTreeMap<String, Vec<RunSummary>>| m.keys().cloned().collect::<Vec<_>>();
    // skip: the first run is still running at 1 and 2.
    assert_eq!(keys(&f.runs(ids["skip"]).await), [key(0)]);
    // allow_all: all three.
    assert_eq!(
        keys(&f.runs(ids["allow_all"]).await),
        [key(0), key(1), key(2)]
    );
    // cancel_previous: all three, each cancelling the one before.
    let c = f.runs(ids["cancel_previous"]).await;
    assert_eq!(keys(&c), [key(0), key(1), key(2)]);
    assert!(f.cancel_posted(c[&key(0)][0].run_id).await);
    assert!(f.cancel_posted(c[&key(1)][0].run_id).await);
    assert!(!f.cancel_posted(c[&key(2)][0].run_id).await);
    // buffer_one: 1 is buffered, 2 skipped.
    let b = f.runs(ids["buffer_one"]).await;
    assert_eq!(keys(&b), [key(0)]);
    // The first runs end: skip fires again at 3; buffer_one starts 1 now.
    finish(&*f.log, f.run_at(ids["skip"], &key(0)).await.run_id).await;
    finish(&*f.log, b[&key(0)][0].run_id).await;
    f.tick(at(2) + Duration::minutes(1)).await;
    assert_eq!(keys(&f.runs(ids["buffer_one"]).await), [key(0), key(1)]);
    assert_eq!(keys(&f.runs(ids["skip"]).await), [key(0)]);
    f.tick(at(3) + Duration::seconds(1)).await;
    assert_eq!(keys(&f.runs(ids["skip"]).await), [key(0), key(3)]);
    // buffer_one's run of 1 runs: 3 is buffered.
    assert_eq!(keys(&f.runs(ids["buffer_one"]).await), [key(0), key(1)]);
    let stored = f
        .log
        .schedule(None, ids["buffer_one"])
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.buffered.map(rfc), Some(key(3)));
    // A run of a finished schedule is a run like any: the cancelled ones
    // are still there, not done (no worker), and counted once each.
    let run = f.run_at(ids["cancel_previous"], &key(0)).await;
    assert_ne!(run.status, RunStatus::Done);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_names_the_field_and_creates_nothing() {
    let f = fleet().await;
    let good = json!({"name": "n", "cron": "0 3 * * *", "time_zone": "Europe/Berlin", "goal": "g {{ fire_time }}"});
    let with = |k: &str, v: Value| {
        let mut b = good.clone();
        b[k] = v;
        b
    };
    let cases = [
        (with("cron", json!("61 * * * *")), 422, "cron"),
        (with("cron", json!("* * *")), 422, "cron"),
        (
            with("time_zone", json!("Mars/Olympus_Mons")),
            422,
            "time_zone",
        ),
        (with("unexpected", json!(1)), 422, "unexpected"),
        (with("agent", json!("nobody-registered-this")), 422, "agent"),
        (with("goal", json!("Run {{ fire_tim }}")), 422, "goal"),
        (with("interval_ms", json!(60000)), 422, "interval_ms"),
        (with("jitter_ms", json!(3600001)), 422, "jitter_ms"),
        (with("overlap", json!("sometimes")), 422, "overlap"),
        (
            with("metadata", json!({"schedule_id": "x"})),
            422,
            "metadata.schedule_id",
        ),
        (
            with("config", json!({"budget": {"max_turns": "9"}})),
            422,
            "config.budget.max_turns",
        ),
    ];
    for (body, status, field) in cases {
        let r = f
            .call(Method::POST, "/v1/schedules", SUB_A, Some(body.clone()))
            .await;
        assert_eq!(r.status.as_u16(), status, "{body}: {}", r.text);
        assert_eq!(r.body["error"]["field"], field, "{body}: {}", r.text);
        assert!(!r.body["error"]["message"].as_str().unwrap().is_empty());
    }
    // The parser's reason is in the answer.
    let r = f
        .call(
            Method::POST,
            "/v1/schedules",
            SUB_A,
            Some(with("cron", json!("61 * * * *"))),
        )
        .await;
    assert!(
        r.text.to_lowercase().contains("61")
            || r.text.contains("out of bounds")
            || r.text.contains("range"),
        "{}",
        r.text
    );
    // Without the submit scope.
    let r = f
        .call(Method::POST, "/v1/schedules", APP_A, Some(good.clone()))
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert!(
        f.log.schedules(None, None, 100).await.unwrap().is_empty(),
        "nothing stored"
    );
    assert!(
        f.log
            .list_runs(&RunFilter {
                limit: 10,
                ..Default::default()
            })
            .await
            .unwrap()
            .is_empty()
    );
    // A name is unique per tenant; another tenant may use it.
    f.create(good.clone()).await;
    let r = f
        .call(Method::POST, "/v1/schedules", SUB_A, Some(good.clone()))
        .await;
    assert_eq!(
        (r.status, r.code()),
        (StatusCode::CONFLICT, "schedule_exists")
    );
    let r = f
        .call(Method::POST, "/v1/schedules", SUB_B, Some(good.clone()))
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_shows_next_fire_times_pauses_patches_backfills_and_isolates_tenants() {
    let f = fleet().await;
    let id = f
        .create(
            json!({"name": "berlin", "cron": "30 2 * * *", "time_zone": "Europe/Berlin",
                       "goal": "Nightly {{ fire_time }}"}),
        )
        .await;
    let uri = format!("/v1/schedules/{id}");
    let r = f.call(Method::GET, &uri, SUB_A, None).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let next = r.body["next_fire_times"].as_array().unwrap();
    assert_eq!(next.len(), 5);
    for n in next {
        let local = n["local"].as_str().unwrap();
        assert!(
            local.contains("T02:30:00+0") || local.contains("T03:00:00+02:00"),
            "{local}"
        );
        assert!(n["utc"].as_str().unwrap().ends_with('Z'));
    }
    // Another tenant: exactly like a missing one.
    let theirs = f.call(Method::GET, &uri, SUB_B, None).await;
    let missing = f
        .call(
            Method::GET,
            &format!("/v1/schedules/{}", Uuid::now_v7()),
            SUB_B,
            None,
        )
        .await;
    assert_eq!(
        (theirs.status, theirs.code()),
        (StatusCode::NOT_FOUND, "schedule_not_found")
    );
    assert_eq!(theirs.code(), missing.code());
    let list_b = f.call(Method::GET, "/v1/schedules", SUB_B, None).await;
    assert_eq!(list_b.body["schedules"].as_array().unwrap().len(), 0);
    let list_admin = f.call(Method::GET, "/v1/schedules", ADMIN, None).await;
    assert_eq!(list_admin.body["schedules"].as_array().unwrap().len(), 1);
    for (m, path) in [
        (Method::PATCH, uri.clone()),
        (Method::POST, format!("{uri}/pause")),
        (Method::DELETE, uri.clone()),
    ] {
        let body = (m == Method::PATCH).then(|| json!({"goal": "x"}));
        let r = f.call(m.clone(), &path, SUB_B, body).await;
        assert_eq!(r.status, StatusCode::NOT_FOUND, "{m} {path}: {}", r.text);
    }
    // Pause: no next fire times, not due; unpause counts from now.
    let r = f
        .call(Method::POST, &format!("{uri}/pause"), SUB_A, None)
        .await;
    assert_eq!(r.body["paused"], true, "{}", r.text);
    let r = f.call(Method::GET, &uri, SUB_A, None).await;
    assert!(r.body.get("next_fire_times").is_none(), "{}", r.text);
    let far = Utc::now() + Duration::days(3);
    assert_eq!(
        f.tick(far).await.schedules,
        0,
        "a paused schedule is never due"
    );
    let r = f
        .call(Method::POST, &format!("{uri}/unpause"), SUB_A, None)
        .await;
    assert_eq!(r.body["paused"], false);
    // Patch: switch to an interval; the cron fields go.
    let r = f
        .call(
            Method::PATCH,
            &uri,
            SUB_A,
            Some(json!({"interval_ms": 3600000, "overlap": "allow_all"})),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.body["definition"]["interval_ms"], 3600000);
    assert!(r.body["definition"].get("cron").is_none(), "{}", r.text);
    let r = f
        .call(
            Method::PATCH,
            &uri,
            SUB_A,
            Some(json!({"time_zone": "Nowhere/Else"})),
        )
        .await;
    assert_eq!(r.body["error"]["field"], "time_zone", "{}", r.text);
    // Backfill: one run per hour in the range, keyed like a firing; again: the same runs.
    let to = Utc::now().duration_trunc(Duration::hours(1)).unwrap() - Duration::hours(1);
    let from = to - Duration::hours(2);
    let body = json!({"from": rfc(from), "to": rfc(to)});
    let r = f
        .call(
            Method::POST,
            &format!("{uri}/backfill"),
            SUB_A,
            Some(body.clone()),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let runs = r.body["runs"].as_array().unwrap().clone();
    assert_eq!(runs.len(), 3);
    assert!(runs.iter().all(|x| x["created"] == true));
    let again = f
        .call(Method::POST, &format!("{uri}/backfill"), SUB_A, Some(body))
        .await;
    assert_eq!(again.body["runs"].as_array().unwrap().len(), 3);
    assert!(
        again.body["runs"]
            .as_array()
            .unwrap()
            .iter()
            .all(|x| x["created"] == false)
    );
    assert_eq!(f.runs(id).await.len(), 3);
    // Bounds: the future, more than 100 fire times, to before from.
    for (b, field) in [
        (
            json!({"from": rfc(from), "to": rfc(Utc::now() + Duration::hours(1))}),
            "to",
        ),
        (
            json!({"from": rfc(from - Duration::days(10)), "to": rfc(to)}),
            "to",
        ),
        (json!({"from": rfc(to), "to": rfc(from)}), "to"),
        (json!({"from": rfc(from)}), ""),
    ] {
        let r = f
            .call(
                Method::POST,
                &format!("{uri}/backfill"),
                SUB_A,
                Some(b.clone()),
            )
            .await;
        assert_eq!(
            r.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{b}: {}",
            r.text
        );
        if !field.is_empty() {
            assert_eq!(r.body["error"]["field"], field, "{b}: {}", r.text);
        }
    }
    assert_eq!(
        f.runs(id).await.len(),
        3,
        "a refused backfill starts nothing"
    );
    // Delete: gone; its runs stay.
    let r = f.call(Method::DELETE, &uri, SUB_A, None).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    assert_eq!(
        f.call(Method::GET, &uri, SUB_A, None).await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(f.runs(id).await.len(), 3);
}
