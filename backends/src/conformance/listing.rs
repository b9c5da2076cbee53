//! Conformance of run listing ([`crate::RunLog::list_runs`]) and of the run
//! view's fields ([`crate::RunSummary`]): newest first, every filter of
//! [`RunFilter`], cursor paging while runs arrive, tenant isolation. Every
//! adapter's tests run these beside [`super::all`] ([`all`]).

use std::collections::BTreeMap;

use glia_proto::{AgentRef, Event, EventKind, Outcome, RunConfig};
use uuid::Uuid;

use super::sample_log;
use crate::{EventLog, NewRun, OutcomeKind, RunFilter, RunStatus, RunSummary};

const TTL: std::time::Duration = std::time::Duration::from_secs(30);

/// Every check of this module, each on a fresh log.
pub async fn all<L: EventLog, F: std::future::Future<Output = L>>(fresh: impl Fn() -> F) {
    lists_and_filters_runs(&fresh().await).await;
    pages_by_cursor_while_runs_arrive(&fresh().await).await;
}

/// A run of the listing fixture: how it ends up, what it carries.
struct Fixture {
    /// The agent version it is admitted with (agent `triage`), if any.
    agent_version: Option<u32>,
    tags: &'static [&'static str],
    metadata: &'static [(&'static str, &'static str)],
    end: End,
}

enum End {
    /// Admitted only: runnable.
    Admitted,
    /// The sample log up to its approval: parked, 15 tokens, 7 micros.
    Parked,
    /// The whole sample log: succeeded, 7 micros.
    Succeeded,
    /// Failed at once with this error.
    Failed(&'static str),
    /// Cancelled at once with this reason.
    Cancelled(&'static str),
}

/// Admit a run of `tenant` as `f` says and commit its events; answers its
/// summary as the log reads it back.
async fn admit(log: &dyn EventLog, tenant: &str, f: &Fixture) -> RunSummary {
    let s = sample_log();
    let mut start = s.parked[0].clone();
    if let (Some(version), EventKind::SessionStart { config, .. }) =
        (f.agent_version, &mut start.kind)
    {
        *config = RunConfig {
            agent: Some(AgentRef {
                name: "triage".into(),
                version,
                content_hash: format!("sha256:{}", "0".repeat(64)),
            }),
            ..RunConfig::default()
        };
    }
    let (run, created) = log
        .create_run(NewRun {
            tenant: tenant.into(),
            idempotency_key: None,
            batch_id: None,
            start: start.clone(),
            tags: f.tags.iter().map(|t| (*t).to_owned()).collect(),
            metadata: f
                .metadata
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            custom_id: Some(format!("item-{}", s.run_id)),
            parent_run_id: None,
            parent_call_id: None,
            depth: 0,
        })
        .await
        .unwrap();
    assert!(created);
    assert_eq!(run.status, RunStatus::Runnable);
    let ending = |kind: EventKind| Event {
        run_id: s.run_id,
        seq: 2,
        at: s.parked[1].at,
        kind,
    };
    let events: Vec<Event> = match &f.end {
        End::Admitted => return log.get_run(s.run_id).await.unwrap(),
        End::Parked => s.parked[1..].to_vec(),
        End::Succeeded => [&s.parked[1..], &s.rest[..]].concat(),
        // Planning, so it may fail or be cancelled at once.
        End::Failed(error) => vec![ending(EventKind::SessionComplete {
            outcome: Outcome::Failed {
                error: (*error).into(),
            },
        })],
        End::Cancelled(reason) => vec![ending(EventKind::SessionCancel {
            reason: (*reason).into(),
        })],
    };
    let all = [vec![start], events.clone()].concat();
    let lease = log.acquire(s.run_id, "w", TTL).await.unwrap();
    let state = glia_proto::RunState::replay(s.run_id, &all).expect("the fixture replays");
    log.commit(&lease, &events, &state, &[]).await.unwrap();
    log.get_run(s.run_id).await.unwrap()
}

async fn ids(log: &dyn EventLog, filter: RunFilter) -> Vec<Uuid> {
    log.list_runs(&RunFilter {
        limit: 1000,
        ..filter
    })
    .await
    .unwrap()
    .iter()
    .map(|r| r.run_id)
    .collect()
}

/// The run view's fields as commits leave them, and listing: newest first,
/// each filter alone and combined, the cursor, tenant isolation.
pub async fn lists_and_filters_runs(log: &dyn EventLog) {
    let tenant = format!("lf-{}", Uuid::now_v7());
    let other = format!("lf-other-{}", Uuid::now_v7());
    let fixtures = [
        Fixture {
            agent_version: Some(1),
            tags: &["alpha"],
            metadata: &[("team", "a")],
            end: End::Parked,
        },
        Fixture {
            agent_version: Some(2),
            tags: &["alpha", "beta"],
            metadata: &[("team", "b")],
            end: End::Failed("Timeout talking to the CRM (50% done)"),
        },
        Fixture {
            agent_version: None,
            tags: &[],
            metadata: &[("team", "a"), ("env", "prod")],
            end: End::Cancelled("Stopped by Ana"),
        },
        Fixture {
            agent_version: Some(2),
            tags: &["beta"],
            metadata: &[],
            end: End::Succeeded,
        },
        Fixture {
            agent_version: None,
            tags: &[],
            metadata: &[],
            end: End::Admitted,
        },
    ];
    let mut runs = Vec::new();
    for f in &fixtures {
        runs.push(admit(log, &tenant, f).await);
    }
    // Another tenant's run carries the same labels.
    let foreign = admit(log, &other, &fixtures[1]).await;
    let [parked, failed, cancelled, succeeded, admitted] = [0, 1, 2, 3, 4].map(|i| &runs[i]);

    // The view: what admission and the commits wrote.
    assert_eq!(
        (parked.agent.as_deref(), parked.agent_version),
        (Some("triage"), Some(1))
    );
    assert_eq!(
        (cancelled.agent.as_deref(), cancelled.agent_version),
        (None, None)
    );
    assert_eq!(failed.tags, ["alpha", "beta"]);
    assert_eq!(
        cancelled.metadata,
        BTreeMap::from([("env".into(), "prod".into()), ("team".into(), "a".into())])
    );
    assert_eq!(
        parked.custom_id,
        Some(format!("item-{}", parked.run_id)),
        "custom_id kept"
    );
    assert_eq!(parked.usage.tokens.input_tokens, 10);
    assert_eq!(parked.usage.tokens.output_tokens, 5);
    assert_eq!(parked.usage.cost_usd_micros, 7);
    assert_eq!(parked.usage.turns, 1);
    assert_eq!(parked.steps, 1, "one step started");
    assert_eq!(parked.status, RunStatus::Parked);
    assert_eq!((parked.error.as_deref(), parked.ended_at), (None, None));
    assert_eq!(
        failed.error.as_deref(),
        Some("Timeout talking to the CRM (50% done)")
    );
    assert_eq!(cancelled.error.as_deref(), Some("Stopped by Ana"));
    assert_eq!(succeeded.error, None);
    for done in [failed, cancelled, succeeded] {
        let ended = done.ended_at.expect("a done run has ended_at");
        assert!(ended >= done.created_at && ended <= done.updated_at);
    }
    assert_eq!(succeeded.usage.turns, 2);
    assert_eq!(admitted.ended_at, None);
    for run in &runs {
        assert_eq!(run.trace_id, run.run_id.simple().to_string());
    }

    let mine = |filter: RunFilter| RunFilter {
        tenant: Some(tenant.clone()),
        ..filter
    };
    let expect = |picked: &[&RunSummary]| {
        let mut ids: Vec<Uuid> = picked.iter().map(|r| r.run_id).collect();
        ids.sort_by(|a, b| b.cmp(a));
        ids
    };

    // Newest first; what the listing answers is what get_run answers.
    let listed = log
        .list_runs(&mine(RunFilter {
            limit: 100,
            ..RunFilter::default()
        }))
        .await
        .unwrap();
    assert_eq!(
        listed.iter().map(|r| r.run_id).collect::<Vec<_>>(),
        expect(&runs.iter().collect::<Vec<_>>())
    );
    for r in &listed {
        assert_eq!(Some(r), runs.iter().find(|x| x.run_id == r.run_id));
    }

    // Each filter, alone and with others.
    let cases: Vec<(&str, RunFilter, Vec<&RunSummary>)> = vec![
        (
            "status parked",
            RunFilter {
                status: Some(RunStatus::Parked),
                ..RunFilter::default()
            },
            vec![parked],
        ),
        (
            "status done",
            RunFilter {
                status: Some(RunStatus::Done),
                ..RunFilter::default()
            },
            vec![failed, cancelled, succeeded],
        ),
        (
            "outcome failed",
            RunFilter {
                outcome: Some(OutcomeKind::Failed),
                ..RunFilter::default()
            },
            vec![failed],
        ),
        (
            "outcome cancelled",
            RunFilter {
                outcome: Some(OutcomeKind::Cancelled),
                ..RunFilter::default()
            },
            vec![cancelled],
        ),
        (
            "status done and outcome succeeded",
            RunFilter {
                status: Some(RunStatus::Done),
                outcome: Some(OutcomeKind::Succeeded),
                ..RunFilter::default()
            },
            vec![succeeded],
        ),
        (
            "status parked and outcome failed",
            RunFilter {
                status: Some(RunStatus::Parked),
                outcome: Some(OutcomeKind::Failed),
                ..RunFilter::default()
            },
            vec![],
        ),
        (
            "agent",
            RunFilter {
                agent: Some("triage".into()),
                ..RunFilter::default()
            },
            vec![parked, failed, succeeded],
        ),
        (
            "agent and version",
            RunFilter {
                agent: Some("triage".into()),
                agent_version: Some(2),
                ..RunFilter::default()
            },
            vec![failed, succeeded],
        ),
        (
            "version alone",
            RunFilter {
                agent_version: Some(1),
                ..RunFilter::default()
            },
            vec![parked],
        ),
        (
            "another agent",
            RunFilter {
                agent: Some("triag".into()),
                ..RunFilter::default()
            },
            vec![],
        ),
        (
            "one tag",
            RunFilter {
                tags: vec!["alpha".into()],
                ..RunFilter::default()
            },
            vec![parked, failed],
        ),
        (
            "two tags, all must match",
            RunFilter {
                tags: vec!["beta".into(), "alpha".into()],
                ..RunFilter::default()
            },
            vec![failed],
        ),
        (
            "a tag's prefix is not the tag",
            RunFilter {
                tags: vec!["alph".into()],
                ..RunFilter::default()
            },
            vec![],
        ),
        (
            "one pair",
            RunFilter {
                metadata: BTreeMap::from([("team".into(), "a".into())]),
                ..RunFilter::default()
            },
            vec![parked, cancelled],
        ),
        (
            "two pairs, all must match",
            RunFilter {
                metadata: BTreeMap::from([
                    ("team".into(), "a".into()),
                    ("env".into(), "prod".into()),
                ]),
                ..RunFilter::default()
            },
            vec![cancelled],
        ),
        (
            "a key with another value",
            RunFilter {
                metadata: BTreeMap::from([("team".into(), "c".into())]),
                ..RunFilter::default()
            },
            vec![],
        ),
        (
            "tag and pair",
            RunFilter {
                tags: vec!["alpha".into()],
                metadata: BTreeMap::from([("team".into(), "b".into())]),
                ..RunFilter::default()
            },
            vec![failed],
        ),
        (
            "min cost",
            RunFilter {
                min_cost_usd_micros: Some(7),
                ..RunFilter::default()
            },
            vec![parked, succeeded],
        ),
        (
            "max cost",
            RunFilter {
                max_cost_usd_micros: Some(6),
                ..RunFilter::default()
            },
            vec![failed, cancelled, admitted],
        ),
        (
            "a cost range nothing is in",
            RunFilter {
                min_cost_usd_micros: Some(8),
                max_cost_usd_micros: Some(1_000),
                ..RunFilter::default()
            },
            vec![],
        ),
        (
            "error text, any case",
            RunFilter {
                q: Some("crm".into()),
                ..RunFilter::default()
            },
            vec![failed],
        ),
        (
            "a cancel reason",
            RunFilter {
                q: Some("BY ANA".into()),
                ..RunFilter::default()
            },
            vec![cancelled],
        ),
        (
            "% and _ are text, not wildcards",
            RunFilter {
                q: Some("50% done".into()),
                ..RunFilter::default()
            },
            vec![failed],
        ),
        (
            "a wildcard matches nothing",
            RunFilter {
                q: Some("T_meout".into()),
                ..RunFilter::default()
            },
            vec![],
        ),
        (
            "error and status",
            RunFilter {
                q: Some("o".into()),
                outcome: Some(OutcomeKind::Cancelled),
                ..RunFilter::default()
            },
            vec![cancelled],
        ),
        (
            "an agent version too large for any store",
            RunFilter {
                agent_version: Some(u32::MAX),
                ..RunFilter::default()
            },
            vec![],
        ),
        (
            "a cost no run has",
            RunFilter {
                min_cost_usd_micros: Some(u64::MAX),
                ..RunFilter::default()
            },
            vec![],
        ),
        (
            "U+0000 in a filter matches nothing",
            RunFilter {
                tags: vec!["a\0".into()],
                ..RunFilter::default()
            },
            vec![],
        ),
    ];
    for (what, filter, want) in cases {
        assert_eq!(ids(log, mine(filter)).await, expect(&want), "{what}");
    }

    // Time ranges, against the times the log recorded.
    for pivot in &runs {
        let t = pivot.created_at;
        let after: Vec<&RunSummary> = runs.iter().filter(|r| r.created_at >= t).collect();
        let before: Vec<&RunSummary> = runs.iter().filter(|r| r.created_at < t).collect();
        let got = ids(
            log,
            mine(RunFilter {
                created_after: Some(t),
                ..RunFilter::default()
            }),
        )
        .await;
        assert_eq!(got, expect(&after), "created at or after {t}");
        let got = ids(
            log,
            mine(RunFilter {
                created_before: Some(t),
                ..RunFilter::default()
            }),
        )
        .await;
        assert_eq!(got, expect(&before), "created before {t}");
    }

    // Tenant isolation: the other tenant's run carries the same labels and
    // is never listed for this tenant, nor this tenant's for it.
    let labelled = RunFilter {
        tags: vec!["alpha".into()],
        ..RunFilter::default()
    };
    assert!(
        !ids(log, mine(labelled.clone()))
            .await
            .contains(&foreign.run_id)
    );
    assert_eq!(
        ids(
            log,
            RunFilter {
                tenant: Some(other.clone()),
                ..labelled.clone()
            }
        )
        .await,
        [foreign.run_id]
    );
    let everyone = ids(log, labelled).await;
    assert!(
        everyone.contains(&foreign.run_id) && everyone.contains(&failed.run_id),
        "no tenant filter: every tenant's (admins)"
    );
}

/// Paging by cursor while runs arrive: every run that was there when paging
/// began comes exactly once, in order; the new ones (newer than every
/// cursor) come on a new first page.
pub async fn pages_by_cursor_while_runs_arrive(log: &dyn EventLog) {
    let tenant = format!("pg-{}", Uuid::now_v7());
    let plain = Fixture {
        agent_version: None,
        tags: &["p"],
        metadata: &[],
        end: End::Admitted,
    };
    let mut before = Vec::new();
    for _ in 0..7 {
        before.push(admit(log, &tenant, &plain).await.run_id);
    }
    before.sort_by(|a, b| b.cmp(a));
    let filter = |cursor: Option<Uuid>| RunFilter {
        tenant: Some(tenant.clone()),
        tags: vec!["p".into()],
        before: cursor,
        limit: 3,
        ..RunFilter::default()
    };
    let mut seen = Vec::new();
    let mut cursor = None;
    let mut arrived = Vec::new();
    loop {
        let page = log.list_runs(&filter(cursor)).await.unwrap();
        assert!(page.len() <= 3);
        seen.extend(page.iter().map(|r| r.run_id));
        // Two runs arrive between pages.
        for _ in 0..2 {
            arrived.push(admit(log, &tenant, &plain).await.run_id);
        }
        match page.last() {
            Some(last) if page.len() == 3 => cursor = Some(last.run_id),
            _ => break,
        }
    }
    assert_eq!(seen, before, "no gap, no repeat, newest first");
    let first = log
        .list_runs(&RunFilter {
            limit: 1000,
            ..filter(None)
        })
        .await
        .unwrap();
    arrived.sort_by(|a, b| b.cmp(a));
    assert_eq!(
        first.iter().map(|r| r.run_id).collect::<Vec<_>>(),
        [arrived, before].concat(),
        "the new runs first"
    );
}
