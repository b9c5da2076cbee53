//! SSE: resume from Last-Event-ID with no gap and no duplicate while the log
//! grows, live deltas interleaved without ids, the stream ends with the run.

use crate::common;

use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use common::*;
use glia_backends::Ledger;
use glia_proto::{Decision, EventKind, LiveEvent, Message, Outcome, Usage, args_hash};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;
use uuid::Uuid;

#[derive(Debug, Clone, PartialEq)]
struct Frame {
    id: Option<String>,
    event: Option<String>,
    data: String,
}

/// An open SSE response body, parsed frame by frame.
struct Sse {
    body: Body,
    buf: String,
}

impl Sse {
    async fn open(h: &H, uri: &str, last_event_id: Option<u64>) -> Sse {
        let mut req = Request::builder()
            .uri(uri)
            .header(header::AUTHORIZATION, format!("Bearer {SUB_A}"));
        if let Some(id) = last_event_id {
            req = req.header("last-event-id", id.to_string());
        }
        let res = h
            .router
            .clone()
            .oneshot(req.body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(res.headers()[header::CONTENT_TYPE], "text/event-stream");
        Sse {
            body: res.into_body(),
            buf: String::new(),
        }
    }

    /// The next frame (comments skipped), or None when the stream ended.
    async fn next(&mut self) -> Option<Frame> {
        loop {
            if let Some(end) = self.buf.find("\n\n") {
                let raw: String = self.buf.drain(..end + 2).collect();
                let mut f = Frame {
                    id: None,
                    event: None,
                    data: String::new(),
                };
                let mut any = false;
                for line in raw.lines() {
                    if let Some(v) = line.strip_prefix("id:") {
                        f.id = Some(v.trim().to_owned());
                        any = true;
                    } else if let Some(v) = line.strip_prefix("event:") {
                        f.event = Some(v.trim().to_owned());
                        any = true;
                    } else if let Some(v) = line.strip_prefix("data:") {
                        f.data.push_str(v.strip_prefix(' ').unwrap_or(v));
                        any = true;
                    }
                }
                if any {
                    return Some(f);
                }
                continue;
            }
            let frame = tokio::time::timeout(Duration::from_secs(5), self.body.frame())
                .await
                .expect("stream stalled")?;
            if let Ok(data) = frame.unwrap().into_data() {
                self.buf.push_str(std::str::from_utf8(&data).unwrap());
            }
        }
    }

    /// The next persisted event's seq (live frames are collected into `live`).
    async fn next_seq(&mut self, live: &mut Vec<Value>) -> Option<(u64, String)> {
        loop {
            let f = self.next().await?;
            match f.event.as_deref() {
                Some("event") => {
                    let v: Value = serde_json::from_str(&f.data).unwrap();
                    let seq = v["seq"].as_u64().unwrap();
                    assert_eq!(
                        f.id.as_deref(),
                        Some(seq.to_string().as_str()),
                        "id is the seq"
                    );
                    return Some((seq, v["type"].as_str().unwrap().to_owned()));
                }
                Some("live") => {
                    assert!(f.id.is_none(), "live frames carry no id");
                    live.push(serde_json::from_str(&f.data).unwrap());
                }
                other => panic!("unexpected frame {other:?}: {}", f.data),
            }
        }
    }
}

fn finish_after_approval() -> Vec<EventKind> {
    let input = json!({"amount": 1});
    vec![
        EventKind::ApprovalResolved {
            call_id: "c1".into(),
            args_hash: args_hash(&input),
            decision: Decision::Approve,
            by: None,
        },
        EventKind::ToolResult {
            call_id: "c1".into(),
            content: "ok".into(),
            reminder: None,
            duration_ms: 1,
            redactions: Vec::new(),
        },
        EventKind::ModelCall {
            model: "m".into(),
            messages: 3,
            wrap_up: false,
            forced_tool: None,
        },
        EventKind::ModelResponse {
            redactions: Vec::new(),
            message: Message::assistant("Done."),
            usage: Usage::default(),
            stop_reason: "end_turn".into(),
            duration_ms: 1,
            cost_usd_micros: 0,
            rejected: None,
        },
        EventKind::StepEnd {
            index: 0,
            answer: "Done.".into(),
            skipped: false,
        },
        EventKind::SessionComplete {
            outcome: Outcome::Succeeded {
                answer: "Done.".into(),
                output: None,
            },
        },
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_from_last_event_id_has_no_gap_and_no_duplicate() {
    for cut in [2usize, 5, 8, 11] {
        let h = harness();
        let id = create(&h, SUB_A, json!({"goal": "g"})).await;
        let uri = format!("/v1/runs/{id}/events/stream");
        // A writer extends the log one event at a time, like a worker.
        let log = h.log.clone();
        let writer = tokio::spawn(async move {
            let mut kinds = to_model_call();
            let input = json!({"amount": 1});
            let calls = [("c1", "refund", input.clone())];
            let mut park = Vec::new();
            park_for_approval_kinds(id, &calls, &mut park);
            kinds.extend(park);
            kinds.extend(finish_after_approval());
            for k in kinds {
                commit(&*log, id, vec![k]).await;
                tokio::time::sleep(Duration::from_millis(3)).await;
            }
        });
        let mut seen = Vec::new();
        let mut live = Vec::new();
        let mut s = Sse::open(&h, &uri, None).await;
        while seen.len() < cut {
            let (seq, _) = s.next_seq(&mut live).await.expect("stream open");
            seen.push(seq);
        }
        drop(s); // the client goes away mid-run
        let last = *seen.last().unwrap();
        let mut s = Sse::open(&h, &uri, Some(last)).await;
        let mut last_type = String::new();
        while let Some((seq, ty)) = s.next_seq(&mut live).await {
            seen.push(seq);
            last_type = ty;
        }
        writer.await.unwrap();
        assert_eq!(
            last_type, "session.complete",
            "the stream ends with the run"
        );
        let n = seen.len() as u64;
        assert_eq!(
            seen,
            (1..=n).collect::<Vec<_>>(),
            "cut after {cut}: no gap, no duplicate"
        );
        assert_eq!(n, 15);
    }
}

/// The approval park events of `common::park_for_approval`, as kinds.
fn park_for_approval_kinds(run_id: Uuid, calls: &[(&str, &str, Value)], out: &mut Vec<EventKind>) {
    use glia_proto::{ContentBlock, Disposition, PullPoint, Role, ToolCallRecord};
    let content = calls
        .iter()
        .map(|(id, name, input)| ContentBlock::ToolUse {
            id: (*id).into(),
            name: (*name).into(),
            input: input.clone(),
        })
        .collect();
    out.push(EventKind::ModelResponse {
        redactions: Vec::new(),
        message: Message {
            role: Role::Assistant,
            content,
        },
        usage: Usage::default(),
        stop_reason: "tool_use".into(),
        duration_ms: 1,
        cost_usd_micros: 0,
        rejected: None,
    });
    for (id, name, input) in calls {
        out.push(EventKind::ToolCall(ToolCallRecord {
            call_id: (*id).into(),
            name: (*name).into(),
            input: input.clone(),
            args_hash: args_hash(input),
            idempotency_key: format!("{run_id}:{id}"),
            disposition: Disposition::Approval,
        }));
        out.push(EventKind::ApprovalRequested {
            call_id: (*id).into(),
            tool: (*name).into(),
            input: input.clone(),
            args_hash: args_hash(input),
            expires_at: None,
            interrupted: false,
        });
    }
    out.push(EventKind::SessionPause {
        pull_point: PullPoint::AwaitingApproval {
            call_ids: calls.iter().map(|c| c.0.to_owned()).collect(),
        },
    });
}

#[tokio::test]
async fn live_deltas_are_interleaved_without_ids() {
    let h = harness();
    let id = create(&h, SUB_A, json!({"goal": "g"})).await;
    let mut s = Sse::open(&h, &format!("/v1/runs/{id}/events/stream"), None).await;
    let mut live = Vec::new();
    assert_eq!(
        s.next_seq(&mut live).await,
        Some((1, "session.start".into()))
    );
    let delta = LiveEvent::ModelDelta {
        channel: "text".into(),
        delta: "Hel".into(),
    };
    h.ledger.publish_live(id, &delta).await.unwrap();
    let f = s.next().await.unwrap();
    assert_eq!((f.event.as_deref(), f.id.as_deref()), (Some("live"), None));
    assert_eq!(serde_json::from_str::<LiveEvent>(&f.data).unwrap(), delta);
    commit(&*h.log, id, to_model_call()).await;
    for seq in 2..=5 {
        assert_eq!(s.next_seq(&mut live).await.unwrap().0, seq);
    }
}

#[tokio::test]
async fn a_finished_run_streams_its_log_and_ends_and_after_is_honoured() {
    let h = harness();
    let id = create(&h, SUB_A, json!({"goal": "g"})).await;
    finish(&*h.log, id).await;
    let mut live = Vec::new();
    let mut s = Sse::open(&h, &format!("/v1/runs/{id}/events/stream"), None).await;
    assert_eq!(
        s.next_seq(&mut live).await,
        Some((1, "session.start".into()))
    );
    assert_eq!(
        s.next_seq(&mut live).await,
        Some((2, "session.complete".into()))
    );
    assert_eq!(s.next_seq(&mut live).await, None, "ended");
    let mut s = Sse::open(&h, &format!("/v1/runs/{id}/events/stream?after=1"), None).await;
    assert_eq!(
        s.next_seq(&mut live).await,
        Some((2, "session.complete".into()))
    );
    assert_eq!(s.next_seq(&mut live).await, None);
    // Last-Event-ID wins over `after`.
    let mut s = Sse::open(&h, &format!("/v1/runs/{id}/events/stream?after=0"), Some(1)).await;
    assert_eq!(
        s.next_seq(&mut live).await,
        Some((2, "session.complete".into()))
    );
    assert_eq!(s.next_seq(&mut live).await, None);
    // A bad Last-Event-ID.
    let req = Request::builder()
        .uri(format!("/v1/runs/{id}/events/stream"))
        .header(header::AUTHORIZATION, format!("Bearer {SUB_A}"))
        .header("last-event-id", "abc")
        .body(Body::empty())
        .unwrap();
    let r = send(&h.router, req).await;
    assert_eq!(
        (r.status, r.code()),
        (StatusCode::BAD_REQUEST, "invalid_header")
    );
    assert_eq!(h.app.metrics().sse_streams.get(), 0, "every stream closed");
}
