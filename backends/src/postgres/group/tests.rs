//! The plans of [`FENCED_COMMIT`] and [`FENCED_APPEND`] on a real database.

use super::{FENCED_APPEND, FENCED_COMMIT};
use crate::testkit::TestDb;

/// The generic plan of [`FENCED_COMMIT`] (the one a pooled connection
/// settles on after a few executions), on a fresh database and on one
/// holding a busy fleet's pending approvals.
async fn generic_plan(sql: &tokio_postgres::Client) -> String {
    sql.batch_execute(&format!(
        "DEALLOCATE ALL; SET plan_cache_mode = force_generic_plan; PREPARE step AS {}",
        *FENCED_COMMIT
    ))
    .await
    .expect("prepare the step");
    let nulls = vec!["NULL"; 26].join(", ");
    let rows = sql
        .query(&format!("EXPLAIN EXECUTE step({nulls})"), &[])
        .await
        .expect("explain the step");
    rows.iter()
        .map(|r| r.get::<_, String>(0))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A step's commit reads only its own run's rows, whatever the fleet
/// holds. Its `decided` part once scanned every pending approval of every
/// run at every step (`approvals_pending`, then a filter by run): a cost
/// that grew with the fleet. The parts most steps do not need (approvals
/// decided, inbox items consumed) are gated on parameters alone.
#[tokio::test]
async fn a_step_commit_reads_only_its_run() {
    let db = TestDb::new().await;
    let _migrated = db.log().await;
    let sql = db.sql().await;
    for busy in [false, true] {
        if busy {
            sql.batch_execute(
                "INSERT INTO runs (id, tenant, goal, status, phase, head_seq) \
                   SELECT gen_random_uuid(), 't', 'g', 'parked', 'awaiting_approval', 1 FROM generate_series(1, 2000); \
                 INSERT INTO approvals (run_id, tenant, call_id, tool, input, args_hash, requested_at) \
                   SELECT id, 't', 'c1', 'refund', '{}', 'h', now() FROM runs; \
                 ANALYZE",
            )
            .await
            .expect("a busy fleet's rows");
        }
        let plan = generic_plan(&sql).await;
        assert!(
            !plan.contains("approvals_pending"),
            "busy = {busy}: the step scans the fleet's pending approvals:\n{plan}"
        );
        assert!(
            plan.contains("approvals_run_pending"),
            "busy = {busy}: the run's pending approvals by index:\n{plan}"
        );
        let gates = plan
            .lines()
            .filter(|l| l.contains("One-Time Filter") && l.contains("cardinality"))
            .count();
        assert_eq!(
            gates, 2,
            "busy = {busy}: `decided` and `consumed` gated on their parameters:\n{plan}"
        );
    }
    // Most steps: the run row and the events, nothing else.
    sql.batch_execute(&format!("PREPARE append AS {}", *FENCED_APPEND))
        .await
        .expect("prepare the append");
    let nulls = vec!["NULL"; 15].join(", ");
    let plan: Vec<String> = sql
        .query(&format!("EXPLAIN EXECUTE append({nulls})"), &[])
        .await
        .expect("explain the append")
        .iter()
        .map(|r| r.get(0))
        .collect();
    let plan = plan.join("\n");
    assert!(
        plan.contains("Update on runs") && plan.contains("Insert on events"),
        "{plan}"
    );
    assert!(
        !plan.contains("approvals") && !plan.contains("inbox"),
        "an append opens nothing else:\n{plan}"
    );
}

/// A commit that changes what nearly every step changes (usage, cost,
/// steps, head, phase, updated_at) and not the status is a HOT update: no
/// column it writes is indexed (V13 keeps usage unindexed for this), so no
/// index entry is written and the row stays on its page.
#[tokio::test]
async fn a_step_that_keeps_the_status_is_a_hot_update() {
    let db = TestDb::new().await;
    let _migrated = db.log().await;
    let mut sql = db.sql().await;
    let id = uuid::Uuid::now_v7();
    sql.execute(
        "INSERT INTO runs (id, tenant, goal, status, phase, head_seq, agent, agent_version, tags, metadata) \
         VALUES ($1, 't', 'g', 'runnable', 'executing', 3, 'triage', 1, '{a,b}', '{\"k\": \"v\"}')",
        &[&id],
    )
    .await
    .expect("a run row");
    let update = format!(
        "UPDATE runs SET {} WHERE id = $1",
        super::summary_set(2, "now()")
    );
    let tx = sql.transaction().await.expect("begin");
    let usage: Vec<i64> = vec![2, 1, 1500, 100, 20, 0, 0, 0, 1234, 1];
    let changed = tx
        .execute(
            &update,
            &[
                &id,
                &"runnable",
                &"reflecting",
                &None::<serde_json::Value>,
                &None::<serde_json::Value>,
                &9_i64,
                &usage,
                &None::<String>,
            ],
        )
        .await
        .expect("the step's update");
    assert_eq!(changed, 1);
    let hot: i64 = tx
        .query_one(
            "SELECT pg_stat_get_xact_tuples_hot_updated('runs'::regclass)",
            &[],
        )
        .await
        .expect("this transaction's HOT updates")
        .get(0);
    assert_eq!(hot, 1, "the step's update of the run row is HOT");
    tx.rollback().await.expect("rollback");
}
