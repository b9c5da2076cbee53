//! Conformance of [`ScheduleStore`]: create with a name unique per tenant,
//! tenant isolation (another tenant's schedule reads like a missing one),
//! paging by id, compare-and-set on the revision (one of two concurrent
//! writers wins), what [`ScheduleStore::due`] answers, delete. Every
//! adapter's tests run [`all`] (memory, SQLite, Postgres).

use chrono::{DateTime, Duration, TimeZone, Utc};
use uuid::Uuid;

use crate::schedules::{Saved, Schedule, ScheduleStore};

fn at(secs: i64) -> DateTime<Utc> {
    Utc.timestamp_opt(1_780_000_000 + secs, 0).unwrap()
}

fn sample(tenant: &str, name: &str) -> Schedule {
    Schedule {
        id: Uuid::now_v7(),
        tenant: tenant.into(),
        name: name.into(),
        spec: format!("{{\"cron\": \"0 * * * *\", \"name\": \"{name}\"}}"),
        paused: false,
        cursor: at(0),
        next_due_at: Some(at(3600)),
        last_run_id: None,
        buffered: None,
        last_error: None,
        revision: 7,
        created_at: at(0),
        updated_at: at(0),
    }
}

fn saved(answer: Saved) -> Schedule {
    match answer {
        Saved::Saved(s) => s,
        other => panic!("expected the write to land, got {other:?}"),
    }
}

/// Every check, on one store (they use names and tenants of their own).
pub async fn all(store: &dyn ScheduleStore) {
    creates_reads_and_isolates_tenants(store).await;
    compare_and_set_on_the_revision(store).await;
    answers_what_is_due(store).await;
}

/// Create stores what it is given at revision 1; a name is unique per
/// tenant (another tenant may reuse it); a read by another tenant, a
/// listing and a delete see only the tenant's own.
pub async fn creates_reads_and_isolates_tenants(store: &dyn ScheduleStore) {
    let tenant = format!("conf-{}", Uuid::now_v7().simple());
    let other = format!("{tenant}-other");
    let a = sample(&tenant, "nightly");
    let created = saved(store.create(&a).await.unwrap());
    assert_eq!(
        created,
        Schedule {
            revision: 1,
            ..a.clone()
        },
        "create stores the schedule as given, at revision 1"
    );
    assert_eq!(
        store.create(&sample(&tenant, "nightly")).await.unwrap(),
        Saved::NameTaken,
        "a name is unique within its tenant"
    );
    assert_eq!(
        store.create(&a).await.unwrap(),
        Saved::Stale,
        "an id that exists is not created again"
    );
    let b = saved(store.create(&sample(&other, "nightly")).await.unwrap());
    assert_eq!(
        store.schedule(Some(&tenant), a.id).await.unwrap(),
        Some(created.clone())
    );
    assert_eq!(
        store.schedule(None, a.id).await.unwrap(),
        Some(created.clone())
    );
    assert_eq!(
        store.schedule(Some(&other), a.id).await.unwrap(),
        None,
        "another tenant's schedule reads like a missing one"
    );
    assert_eq!(
        store.schedule(Some(&tenant), Uuid::now_v7()).await.unwrap(),
        None
    );
    // Paging by id.
    let mut ids = vec![a.id];
    for i in 0..4 {
        ids.push(
            saved(
                store
                    .create(&sample(&tenant, &format!("s{i}")))
                    .await
                    .unwrap(),
            )
            .id,
        );
    }
    let first = store.schedules(Some(&tenant), None, 3).await.unwrap();
    let rest = store
        .schedules(Some(&tenant), Some(first.last().unwrap().id), 100)
        .await
        .unwrap();
    let listed: Vec<Uuid> = first.iter().chain(&rest).map(|s| s.id).collect();
    assert_eq!(listed, ids, "the tenant's schedules by id, paged");
    assert!(
        store
            .schedules(Some(&other), None, 100)
            .await
            .unwrap()
            .iter()
            .all(|s| s.tenant == other)
    );
    // Delete: not another tenant's; the owner's once.
    assert!(!store.delete(Some(&other), a.id).await.unwrap());
    assert!(store.schedule(None, a.id).await.unwrap().is_some());
    assert!(store.delete(Some(&tenant), a.id).await.unwrap());
    assert!(!store.delete(Some(&tenant), a.id).await.unwrap());
    assert_eq!(store.schedule(None, a.id).await.unwrap(), None);
    // Its name is free again.
    saved(store.create(&sample(&tenant, "nightly")).await.unwrap());
    assert!(store.delete(None, b.id).await.unwrap());
}

/// `save` writes every mutable field when the revision is the stored one
/// (and bumps it), and nothing when it is not: of two writers that read the
/// same revision, one lands. A rename onto a taken name writes nothing;
/// tenant, id and creation time never change.
pub async fn compare_and_set_on_the_revision(store: &dyn ScheduleStore) {
    let tenant = format!("conf-{}", Uuid::now_v7().simple());
    let s = saved(store.create(&sample(&tenant, "cas")).await.unwrap());
    let run = Uuid::now_v7();
    let mut next = Schedule {
        tenant: "someone-else".into(),
        created_at: at(99),
        spec: "{\"interval_ms\": 60000}".into(),
        paused: true,
        cursor: at(3600),
        next_due_at: None,
        last_run_id: Some(run),
        buffered: Some(at(7200)),
        last_error: Some("agent refund@3 not found".into()),
        updated_at: at(3601),
        ..s.clone()
    };
    let written = saved(store.save(&next).await.unwrap());
    next.tenant = s.tenant.clone();
    next.created_at = s.created_at;
    next.revision = 2;
    assert_eq!(
        written, next,
        "every mutable field is written, the revision bumped"
    );
    assert_eq!(
        store.save(&s).await.unwrap(),
        Saved::Stale,
        "a write on an old revision lands nowhere"
    );
    assert_eq!(
        store.schedule(None, s.id).await.unwrap(),
        Some(next.clone())
    );
    // Two writers on one revision: exactly one lands.
    let one = Schedule {
        cursor: at(7200),
        ..next.clone()
    };
    let two = Schedule {
        cursor: at(10800),
        ..next.clone()
    };
    let (r1, r2) = futures::join!(store.save(&one), store.save(&two));
    let landed: Vec<Saved> = [r1.unwrap(), r2.unwrap()]
        .into_iter()
        .filter(|r| matches!(r, Saved::Saved(_)))
        .collect();
    assert_eq!(landed.len(), 1, "one of two concurrent writers lands");
    let now = store.schedule(None, s.id).await.unwrap().unwrap();
    assert_eq!(now.revision, 3);
    assert!(now.cursor == at(7200) || now.cursor == at(10800));
    // Renaming onto a taken name.
    saved(store.create(&sample(&tenant, "taken")).await.unwrap());
    let rename = Schedule {
        name: "taken".into(),
        ..now.clone()
    };
    assert_eq!(store.save(&rename).await.unwrap(), Saved::NameTaken);
    assert_eq!(store.schedule(None, s.id).await.unwrap(), Some(now.clone()));
    // A schedule that is gone is stale.
    assert!(store.delete(None, s.id).await.unwrap());
    assert_eq!(store.save(&now).await.unwrap(), Saved::Stale);
}

/// `due` answers the schedules not paused whose due time has come, or that
/// hold a buffered fire time, earliest first.
pub async fn answers_what_is_due(store: &dyn ScheduleStore) {
    // Other checks' schedules on the same store are due too: they are
    // told apart by tenant.
    let base = at(0) + Duration::days(365 * 200);
    let tenant = format!("conf-{}", Uuid::now_v7().simple());
    let make = |name: &str, due: Option<DateTime<Utc>>, paused: bool, buffered: bool| Schedule {
        next_due_at: due,
        paused,
        buffered: buffered.then_some(base),
        cursor: base,
        ..sample(&tenant, name)
    };
    let later = saved(
        store
            .create(&make(
                "later",
                Some(base + Duration::seconds(20)),
                false,
                false,
            ))
            .await
            .unwrap(),
    );
    let sooner = saved(
        store
            .create(&make(
                "sooner",
                Some(base + Duration::seconds(10)),
                false,
                false,
            ))
            .await
            .unwrap(),
    );
    let _future = saved(
        store
            .create(&make(
                "future",
                Some(base + Duration::seconds(60)),
                false,
                false,
            ))
            .await
            .unwrap(),
    );
    let _paused = saved(
        store
            .create(&make("paused", Some(base), true, true))
            .await
            .unwrap(),
    );
    let buffered = saved(
        store
            .create(&make("buffered", None, false, true))
            .await
            .unwrap(),
    );
    let ids = |v: Vec<Schedule>| -> Vec<Uuid> {
        v.into_iter()
            .filter(|s| s.tenant == tenant)
            .map(|s| s.id)
            .collect()
    };
    let due = store.due(base + Duration::seconds(30), 1000).await.unwrap();
    assert_eq!(
        ids(due),
        vec![sooner.id, later.id, buffered.id],
        "due ones earliest first, then buffered ones; not paused, not future"
    );
    let due = store.due(base + Duration::seconds(10), 1000).await.unwrap();
    assert_eq!(
        ids(due),
        vec![sooner.id, buffered.id],
        "due at exactly its time"
    );
    for s in store.schedules(Some(&tenant), None, 100).await.unwrap() {
        store.delete(None, s.id).await.unwrap();
    }
}
