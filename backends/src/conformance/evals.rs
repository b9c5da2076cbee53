//! Conformance of [`EvalStore`]: dataset versions (next version per name,
//! the same content answers the latest unchanged, concurrent puts never
//! share a version), tenant isolation, experiments created once per
//! idempotency key, listing newest first, batches and state written only
//! while running, and a cell graded once (the first grade stands). Every
//! adapter's tests run [`all`] (memory, SQLite, Postgres).

use chrono::{DateTime, TimeZone, Utc};
use uuid::Uuid;

use crate::LogError;
use crate::evals::{EvalStore, Experiment, ExperimentState, Grade, PutDataset};

fn at(secs: i64) -> DateTime<Utc> {
    Utc.timestamp_opt(1_780_000_000 + secs, 123_456_000)
        .unwrap()
}

fn tenant() -> String {
    format!("conf-{}", Uuid::now_v7().simple())
}

fn experiment(tenant: &str, key: Option<&str>) -> Experiment {
    Experiment {
        id: Uuid::now_v7(),
        tenant: tenant.into(),
        name: "refunds".into(),
        idempotency_key: key.map(str::to_owned),
        request_hash: "h1".into(),
        spec: r#"{"name": "refunds"}"#.into(),
        batches: Vec::new(),
        state: ExperimentState::Running,
        created_at: at(0),
        finished_at: None,
    }
}

/// Every check, on one store (each uses tenants of its own).
pub async fn all(store: &dyn EvalStore) {
    datasets_are_versioned_and_immutable(store).await;
    concurrent_puts_never_share_a_version(store).await;
    experiments_are_created_once_per_key(store).await;
    batches_and_state_change_only_while_running(store).await;
    a_cell_is_graded_once(store).await;
    one_dispatcher_tends_an_experiment(store).await;
    running_experiments_take_turns(store).await;
}

/// The running experiments come least recently claimed first: one just
/// claimed goes behind one never claimed, though it is older, so a loop
/// that tends a page at a time reaches them all.
pub async fn running_experiments_take_turns(store: &dyn EvalStore) {
    let t = tenant();
    let (older, newer) = (experiment(&t, None), experiment(&t, None));
    store.create_experiment(&older).await.unwrap();
    store.create_experiment(&newer).await.unwrap();
    let place = |running: &[Experiment], id: Uuid| running.iter().position(|e| e.id == id);
    let running = store.running_experiments(1000).await.unwrap();
    assert!(
        place(&running, older.id) < place(&running, newer.id),
        "oldest first"
    );
    let owner = Uuid::now_v7();
    assert!(
        store
            .tend(
                older.id,
                owner,
                Utc::now(),
                Utc::now() + chrono::Duration::minutes(5)
            )
            .await
            .unwrap()
    );
    let running = store.running_experiments(1000).await.unwrap();
    let (o, n) = (place(&running, older.id), place(&running, newer.id));
    assert!(
        o.is_some() && n < o,
        "the one just claimed goes last: {o:?} {n:?}"
    );
    for e in [&older, &newer] {
        store
            .finish_experiment(None, e.id, ExperimentState::Cancelled, at(1))
            .await
            .unwrap();
    }
}

/// A claim holds against other dispatchers until it runs out; its holder
/// renews it; a finished experiment is tended by none.
pub async fn one_dispatcher_tends_an_experiment(store: &dyn EvalStore) {
    let e = experiment(&tenant(), None);
    store.create_experiment(&e).await.unwrap();
    let (a, b) = (Uuid::now_v7(), Uuid::now_v7());
    assert!(store.tend(e.id, a, at(0), at(10)).await.unwrap());
    assert!(
        !store.tend(e.id, b, at(5), at(15)).await.unwrap(),
        "held by a"
    );
    assert!(
        store.tend(e.id, a, at(5), at(15)).await.unwrap(),
        "a renews"
    );
    assert!(
        !store.tend(e.id, b, at(12), at(22)).await.unwrap(),
        "renewed"
    );
    assert!(
        store.tend(e.id, b, at(16), at(26)).await.unwrap(),
        "a's claim ran out"
    );
    assert!(!store.tend(e.id, a, at(17), at(27)).await.unwrap());
    store
        .finish_experiment(None, e.id, ExperimentState::Completed, at(18))
        .await
        .unwrap();
    assert!(!store.tend(e.id, b, at(19), at(29)).await.unwrap());
    assert!(!store.tend(Uuid::now_v7(), a, at(0), at(1)).await.unwrap());
}

/// A name's first put is version 1; other content is version 2; the same
/// content as the latest answers it unchanged; each version reads back as
/// stored; another tenant sees none of it.
pub async fn datasets_are_versioned_and_immutable(store: &dyn EvalStore) {
    let t = tenant();
    let PutDataset::Created(v1) = store
        .put_dataset(&t, "cases", "{\"id\":\"a\"}\n", "hash-1", 1, at(1))
        .await
        .unwrap()
    else {
        panic!("the first put creates version 1");
    };
    assert_eq!((v1.version, v1.cases, v1.created_at), (1, 1, at(1)));
    let PutDataset::Created(v2) = store
        .put_dataset(
            &t,
            "cases",
            "{\"id\":\"a\"}\n{\"id\":\"b\"}\n",
            "hash-2",
            2,
            at(2),
        )
        .await
        .unwrap()
    else {
        panic!("new content is a new version");
    };
    assert_eq!(v2.version, 2);
    assert_eq!(
        store
            .put_dataset(&t, "cases", "ignored", "hash-2", 2, at(3))
            .await
            .unwrap(),
        PutDataset::Unchanged(v2.clone())
    );
    // The first content again is a new version (only the latest is compared).
    let PutDataset::Created(v3) = store
        .put_dataset(&t, "cases", "{\"id\":\"a\"}\n", "hash-1", 1, at(4))
        .await
        .unwrap()
    else {
        panic!("content of an older version is a new version");
    };
    assert_eq!(v3.version, 3);
    let latest = store
        .dataset(Some(&t), "cases", None)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(latest.info, v3);
    let second = store
        .dataset(Some(&t), "cases", Some(2))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(second.info, v2);
    assert_eq!(second.cases, "{\"id\":\"a\"}\n{\"id\":\"b\"}\n");
    assert!(
        store
            .dataset(Some(&t), "cases", Some(9))
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        store
            .dataset(Some("someone-else"), "cases", None)
            .await
            .unwrap()
            .is_none()
    );
    // The same answers without the cases.
    for (tenant, version, want) in [
        (Some(t.as_str()), None, Some(&v3)),
        (Some(t.as_str()), Some(2), Some(&v2)),
        (Some(t.as_str()), Some(9), None),
        (Some("someone-else"), None, None),
    ] {
        let info = store.dataset_info(tenant, "cases", version).await.unwrap();
        assert_eq!(info.as_ref(), want, "{tenant:?} {version:?}");
    }
    let listed = store.datasets(Some(&t)).await.unwrap();
    assert_eq!(
        listed.iter().map(|d| d.version).collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
    assert!(
        store
            .datasets(Some(&format!("{t}-other")))
            .await
            .unwrap()
            .is_empty()
    );
}

/// Ten concurrent puts of different content under one name get ten
/// different versions, 1 to 10.
pub async fn concurrent_puts_never_share_a_version(store: &dyn EvalStore) {
    let t = tenant();
    let puts = (0..10).map(|i| {
        let t = t.clone();
        async move {
            match store
                .put_dataset(&t, "race", "x", &format!("hash-{i}"), 1, at(i))
                .await
                .unwrap()
            {
                PutDataset::Created(info) => info.version,
                PutDataset::Unchanged(info) => panic!("different content answered {info:?}"),
            }
        }
    });
    let mut versions = futures::future::join_all(puts).await;
    versions.sort();
    assert_eq!(versions, (1..=10).collect::<Vec<u32>>());
}

/// A create stores the experiment as given; a second create with the same
/// tenant and key stores nothing and answers the first; the key is per
/// tenant; reads and listings see only the tenant's own, newest first.
pub async fn experiments_are_created_once_per_key(store: &dyn EvalStore) {
    let t = tenant();
    let first = experiment(&t, Some("k1"));
    let (stored, created) = store.create_experiment(&first).await.unwrap();
    assert!(created);
    assert_eq!(stored, first);
    let again = Experiment {
        request_hash: "h2".into(),
        ..experiment(&t, Some("k1"))
    };
    let (answered, created) = store.create_experiment(&again).await.unwrap();
    assert!(!created);
    assert_eq!(answered, first);
    assert!(
        store
            .experiment(Some(&t), again.id)
            .await
            .unwrap()
            .is_none()
    );
    let other_tenant = experiment(&format!("{t}-other"), Some("k1"));
    assert!(store.create_experiment(&other_tenant).await.unwrap().1);
    let unkeyed = experiment(&t, None);
    assert!(store.create_experiment(&unkeyed).await.unwrap().1);
    assert!(
        store
            .create_experiment(&experiment(&t, None))
            .await
            .unwrap()
            .1
    );
    assert_eq!(
        store.experiment(Some(&t), first.id).await.unwrap(),
        Some(first.clone())
    );
    assert!(
        store
            .experiment(Some(&format!("{t}-other")), first.id)
            .await
            .unwrap()
            .is_none()
    );
    let listed = store.experiments(Some(&t), None, 10).await.unwrap();
    assert_eq!(listed.len(), 3);
    assert!(listed.windows(2).all(|w| w[0].id > w[1].id), "newest first");
    let older = store
        .experiments(Some(&t), Some(listed[0].id), 10)
        .await
        .unwrap();
    assert_eq!(older, listed[1..].to_vec());
}

/// Batches are recorded and the state ends only on a running experiment;
/// a finished one is no longer among the running.
pub async fn batches_and_state_change_only_while_running(store: &dyn EvalStore) {
    let t = tenant();
    let e = experiment(&t, None);
    store.create_experiment(&e).await.unwrap();
    let batches = vec![Uuid::now_v7(), Uuid::now_v7()];
    assert!(store.set_batches(e.id, &batches).await.unwrap());
    assert_eq!(
        store.experiment(None, e.id).await.unwrap().unwrap().batches,
        batches
    );
    let running = store.running_experiments(1000).await.unwrap();
    assert!(running.iter().any(|r| r.id == e.id));
    assert!(
        !store
            .finish_experiment(
                Some("someone-else"),
                e.id,
                ExperimentState::Cancelled,
                at(5)
            )
            .await
            .unwrap()
    );
    assert!(
        store
            .finish_experiment(Some(&t), e.id, ExperimentState::Completed, at(5))
            .await
            .unwrap()
    );
    assert!(
        !store
            .finish_experiment(None, e.id, ExperimentState::Cancelled, at(6))
            .await
            .unwrap(),
        "a finished experiment stays as it ended"
    );
    assert!(!store.set_batches(e.id, &[]).await.unwrap());
    let read = store.experiment(Some(&t), e.id).await.unwrap().unwrap();
    assert_eq!(
        (read.state, read.finished_at, read.batches),
        (ExperimentState::Completed, Some(at(5)), batches)
    );
    let running = store.running_experiments(1000).await.unwrap();
    assert!(running.iter().all(|r| r.id != e.id));
    assert!(
        !store.set_batches(Uuid::now_v7(), &[]).await.unwrap(),
        "an unknown experiment"
    );
}

/// The first grade of a cell stands: a second one is refused (false) and
/// the first reads back; grades list by version then cell; a grade of an
/// unknown experiment is not found.
pub async fn a_cell_is_graded_once(store: &dyn EvalStore) {
    let t = tenant();
    let e = experiment(&t, None);
    store.create_experiment(&e).await.unwrap();
    let grade = |version: &str, cell: &str, text: &str| Grade {
        experiment_id: e.id,
        version: version.into(),
        cell: cell.into(),
        run_id: Uuid::now_v7(),
        grade: text.into(),
        graded_at: at(9),
    };
    let first = grade("support@4", "c1#0", "{\"pass\": true}");
    assert!(store.record_grade(&first).await.unwrap());
    assert!(
        !store
            .record_grade(&grade("support@4", "c1#0", "{\"pass\": false}"))
            .await
            .unwrap()
    );
    let b = grade("support@3", "c2#0", "{}");
    let c = grade("support@3", "c1#1", "{}");
    assert!(store.record_grade(&b).await.unwrap());
    assert!(store.record_grade(&c).await.unwrap());
    assert_eq!(
        store.grades(e.id).await.unwrap(),
        vec![c, b, first],
        "by version then cell, the first grade of a cell kept"
    );
    assert!(store.grades(Uuid::now_v7()).await.unwrap().is_empty());
    assert_eq!(store.grade_count(e.id).await.unwrap(), 3);
    assert_eq!(store.grade_count(Uuid::now_v7()).await.unwrap(), 0);
    let stray = Grade {
        experiment_id: Uuid::now_v7(),
        ..grade("v", "c", "{}")
    };
    assert!(matches!(
        store.record_grade(&stray).await,
        Err(LogError::NotFound(id)) if id == stray.experiment_id
    ));
}
