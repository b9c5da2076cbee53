//! Issue 32, child runs: conformance of the parent link on runs
//! ([`crate::NewRun::parent_run_id`], `parent_call_id`, `depth`), the
//! listing's `parent` and `pull_point` filters, idempotent child creation
//! by the per-tenant key the dispatcher derives from the parent's call, and
//! the children a done parent left behind ([`crate::RunLog::stranded_children`]). Every adapter's tests run [`all`].

use uuid::Uuid;

use super::sample_log;
use crate::{EventLog, NewRun, RunFilter, RunStatus};

const TTL: std::time::Duration = std::time::Duration::from_secs(30);

/// Every check of this module, each on a fresh log.
pub async fn all<L: EventLog, F: std::future::Future<Output = L>>(fresh: impl Fn() -> F) {
    children_link_dedupe_and_filter(&fresh().await).await;
}

fn child_of(tenant: &str, parent: Uuid, call: &str, key: &str, depth: u32) -> NewRun {
    let s = sample_log();
    NewRun {
        tenant: tenant.into(),
        idempotency_key: Some(key.into()),
        batch_id: None,
        start: s.parked[0].clone(),
        tags: Vec::new(),
        metadata: [("glia.child_key".to_owned(), key.to_owned())].into(),
        custom_id: None,
        parent_run_id: Some(parent),
        parent_call_id: Some(call.into()),
        depth,
    }
}

/// A child is created once per (tenant, key) however often it is asked
/// for; it reads back linked; `parent` lists exactly a run's children;
/// `pull_point` selects parked runs by where they wait.
pub async fn children_link_dedupe_and_filter(log: &dyn EventLog) {
    let tenant = format!("ch-{}", Uuid::now_v7());
    let other = format!("ch-other-{}", Uuid::now_v7());
    let p = sample_log();
    let (parent, created) = log
        .create_run(NewRun {
            tenant: tenant.clone(),
            idempotency_key: None,
            batch_id: None,
            start: p.parked[0].clone(),
            tags: Vec::new(),
            metadata: Default::default(),
            custom_id: None,
            parent_run_id: None,
            parent_call_id: None,
            depth: 0,
        })
        .await
        .unwrap();
    assert!(created);
    assert_eq!(
        (
            parent.parent_run_id,
            parent.parent_call_id.as_deref(),
            parent.depth
        ),
        (None, None, 0)
    );

    // The same call asked for twice (two dispatchers, a retry): one child.
    let (first, created) = log
        .create_run(child_of(&tenant, parent.run_id, "call_1", "child:k1", 1))
        .await
        .unwrap();
    assert!(created);
    let (again, created) = log
        .create_run(child_of(&tenant, parent.run_id, "call_1", "child:k1", 1))
        .await
        .unwrap();
    assert!(!created, "the key finds the first child");
    assert_eq!(again.run_id, first.run_id);
    let (second, _) = log
        .create_run(child_of(&tenant, parent.run_id, "call_2", "child:k2", 1))
        .await
        .unwrap();
    // The same key in another tenant is another run.
    let (foreign, created) = log
        .create_run(child_of(&other, parent.run_id, "call_1", "child:k1", 1))
        .await
        .unwrap();
    assert!(created);
    assert_ne!(foreign.run_id, first.run_id);

    // Read back linked, by id and in a listing.
    let got = log.get_run(first.run_id).await.unwrap();
    assert_eq!(got.parent_run_id, Some(parent.run_id));
    assert_eq!(got.parent_call_id.as_deref(), Some("call_1"));
    assert_eq!(got.depth, 1);
    let children = log
        .list_runs(&RunFilter {
            tenant: Some(tenant.clone()),
            parent: Some(parent.run_id),
            limit: 1000,
            ..Default::default()
        })
        .await
        .unwrap();
    let ids: Vec<Uuid> = children.iter().map(|r| r.run_id).collect();
    assert_eq!(
        ids,
        [second.run_id, first.run_id],
        "newest first, only children"
    );
    assert!(children.iter().all(|c| c.depth == 1));
    let none = log
        .list_runs(&RunFilter {
            parent: Some(first.run_id),
            limit: 1000,
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(none.is_empty(), "a child without children lists none");

    // Where a parked run waits selects it; a runnable one never.
    let lease = log.acquire(parent.run_id, "w", TTL).await.unwrap();
    let state = glia_proto::RunState::replay(p.run_id, &p.parked).unwrap();
    log.commit(&lease, &p.parked[1..], &state, &[])
        .await
        .unwrap();
    let waiting = |point: &str| {
        let filter = RunFilter {
            tenant: Some(tenant.clone()),
            pull_point: Some(point.into()),
            limit: 1000,
            ..Default::default()
        };
        async move { log.list_runs(&filter).await.unwrap() }
    };
    let at_approval = waiting("awaiting_approval").await;
    assert_eq!(at_approval.len(), 1);
    assert_eq!(at_approval[0].run_id, parent.run_id);
    assert_eq!(at_approval[0].status, RunStatus::Parked);
    assert!(waiting("awaiting_children").await.is_empty());

    // A child of a parent not done is not stranded; once the parent is done,
    // its children not done are, until they end too.
    let parent_id = parent.run_id;
    let stranded = || async {
        let pairs = log.stranded_children(100_000).await.unwrap();
        for (child, parent) in &pairs {
            if [first.run_id, second.run_id].contains(child) {
                assert_eq!(*parent, parent_id, "each child with its parent");
            }
        }
        pairs
            .into_iter()
            .map(|(child, _)| child)
            .collect::<Vec<_>>()
    };
    let before = stranded().await;
    assert!(!before.contains(&first.run_id) && !before.contains(&second.run_id));
    let mut all = p.parked.clone();
    all.extend(p.rest.iter().cloned());
    let done = glia_proto::RunState::replay(p.run_id, &all).unwrap();
    assert_eq!(done.phase, glia_proto::Phase::Done);
    log.commit(&lease, &p.rest, &done, &[]).await.unwrap();
    let after = stranded().await;
    assert!(
        after.contains(&first.run_id) && after.contains(&second.run_id),
        "{after:?}"
    );
    assert!(
        !after.contains(&parent.run_id),
        "a root run is never stranded"
    );
    let events = log.events(first.run_id, 0, 1).await.unwrap();
    let mut child_log = events.clone();
    let c = sample_log();
    for e in c.parked.iter().chain(&c.rest).skip(1) {
        let mut e = e.clone();
        e.run_id = first.run_id;
        child_log.push(e);
    }
    let child_done = glia_proto::RunState::replay(first.run_id, &child_log).unwrap();
    let child_lease = log.acquire(first.run_id, "w", TTL).await.unwrap();
    log.commit(&child_lease, &child_log[1..], &child_done, &[])
        .await
        .unwrap();
    let after = stranded().await;
    assert!(!after.contains(&first.run_id), "a child that ended is not");
    assert!(after.contains(&second.run_id));
    // Nor one whose cancel waits for a worker.
    log.post(
        second.run_id,
        glia_proto::Payload::Cancel {
            reason: "parent ended".into(),
        },
    )
    .await
    .unwrap();
    assert!(!stranded().await.contains(&second.run_id));
}
