//! Property: edits are part of the conversation. After any sequence of
//! approval decisions — approve, edit, reject — over turns of tool calls, the
//! arguments of every call in each later model request, encoded in both the
//! Anthropic Messages and the OpenAI Chat Completions wire formats, are the
//! arguments the tool really ran with (a rejected call, which never ran,
//! keeps the model's proposal). The log replays to the same conversation.

use std::sync::{Arc, Mutex};

use glia_agent::provider::{ModelRequest, ScriptedProvider, ScriptedTurn};
use glia_agent::tool::{Tool, ToolContext, ToolFailure, ToolRegistry};
use glia_agent::{Agent, FixedClock};
use glia_proto::{Decision, Outcome, Payload, Policy, PolicyAction, RunConfig, RunState, Status};
use glia_providers::{Anthropic, OpenAi, Wire};
use proptest::prelude::*;
use serde_json::{Value, json};
use uuid::Uuid;

/// `refund`: records the call id and the arguments it ran with.
struct Refund(Arc<Mutex<Vec<(String, Value)>>>);

impl Tool for Refund {
    type Args = Value;
    type Output = Value;
    fn name(&self) -> &str {
        "refund"
    }
    fn description(&self) -> &str {
        "Refund an order."
    }
    async fn call(&self, args: Value, ctx: ToolContext) -> Result<Value, ToolFailure> {
        self.0.lock().unwrap().push((ctx.call_id, args.clone()));
        Ok(json!({ "refunded": args }))
    }
}

/// What a person decides about one call.
#[derive(Debug, Clone)]
enum Choice {
    Approve,
    Edit(Value),
    Reject,
}

fn args() -> impl Strategy<Value = Value> {
    (
        "[A-Z][0-9]{1,3}",
        0i64..10_000,
        prop::option::of("[a-z ]{0,12}"),
    )
        .prop_map(|(order, amount, note)| match note {
            Some(note) => json!({ "order": order, "amount": amount, "note": note }),
            None => json!({ "order": order, "amount": amount }),
        })
}

fn choice() -> impl Strategy<Value = Choice> {
    prop_oneof![
        Just(Choice::Approve),
        args().prop_map(Choice::Edit),
        Just(Choice::Reject)
    ]
}

/// Turns of 1–3 calls, each with the model's arguments and a decision.
fn turns() -> impl Strategy<Value = Vec<Vec<(Value, Choice)>>> {
    prop::collection::vec(prop::collection::vec((args(), choice()), 1..=3), 1..=3)
}

/// The tool uses of an encoded request, in order: (name, arguments).
fn anthropic_uses(body: &Value) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for m in body["messages"].as_array().unwrap() {
        for b in m["content"].as_array().into_iter().flatten() {
            if b["type"] == "tool_use" {
                out.push((b["name"].as_str().unwrap().to_owned(), b["input"].clone()));
            }
        }
    }
    out
}

fn openai_uses(body: &Value) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for m in body["messages"].as_array().unwrap() {
        for c in m["tool_calls"].as_array().into_iter().flatten() {
            let arguments: Value =
                serde_json::from_str(c["function"]["arguments"].as_str().unwrap()).unwrap();
            out.push((
                c["function"]["name"].as_str().unwrap().to_owned(),
                arguments,
            ));
        }
    }
    out
}

fn check(turns: Vec<Vec<(Value, Choice)>>) -> Result<(), TestCaseError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let mut script: Vec<ScriptedTurn> = turns
            .iter()
            .map(|calls| {
                ScriptedTurn::calls(
                    &calls
                        .iter()
                        .map(|(a, _)| ("refund", a.clone()))
                        .collect::<Vec<_>>(),
                )
            })
            .collect();
        script.push(ScriptedTurn::text("Done."));
        let provider = Arc::new(ScriptedProvider::new(script));
        let ran = Arc::new(Mutex::new(Vec::new()));
        let mut tools = ToolRegistry::default();
        tools.register(Refund(ran.clone()));
        let agent = Agent::new(provider.clone())
            .with_tools(tools)
            .with_clock(FixedClock(chrono::DateTime::UNIX_EPOCH));
        let config = RunConfig {
            model: "m".into(),
            policies: vec![Policy {
                tool: "refund".into(),
                args: None,
                action: PolicyAction::RequireApproval,
            }],
            ..RunConfig::default()
        };
        let mut log = Vec::new();
        let (mut state, mut status) = agent
            .run(Uuid::now_v7(), "refund what is due", config, &mut log)
            .await
            .unwrap();
        // Expected, call by call in the order the model made them: what ran
        // (None for a rejection) and what the conversation must show.
        let mut expected: Vec<(Option<Value>, Value)> = Vec::new();
        for calls in &turns {
            let ids: Vec<String> = state
                .pending_calls
                .iter()
                .map(|c| c.call_id.clone())
                .collect();
            prop_assert_eq!(ids.len(), calls.len(), "{:?}", status);
            for (id, (proposed, choice)) in ids.iter().zip(calls) {
                let call = state.call(id).unwrap();
                prop_assert_eq!(&call.input, proposed);
                let decision = match choice {
                    Choice::Approve => Decision::Approve,
                    Choice::Edit(input) => Decision::Edit {
                        input: input.clone(),
                    },
                    Choice::Reject => Decision::Reject {
                        reason: "no".into(),
                    },
                };
                expected.push(match choice {
                    Choice::Approve => (Some(proposed.clone()), proposed.clone()),
                    Choice::Edit(input) => (Some(input.clone()), input.clone()),
                    Choice::Reject => (None, proposed.clone()),
                });
                let resume = Payload::Approval {
                    call_id: id.clone(),
                    args_hash: call.args_hash.clone(),
                    decision,
                    by: Some("ana".into()),
                    request_seq: None,
                };
                status = agent
                    .advance(&mut state, Some(resume), &mut log)
                    .await
                    .unwrap();
            }
        }
        prop_assert!(
            matches!(&status, Status::Done(Outcome::Succeeded { .. })),
            "{:?}",
            status
        );
        // The tool ran exactly the approved calls, with the decided arguments.
        let ran: Vec<Value> = ran.lock().unwrap().iter().map(|(_, a)| a.clone()).collect();
        let approved: Vec<Value> = expected.iter().filter_map(|(r, _)| r.clone()).collect();
        prop_assert_eq!(&ran, &approved);
        // Every request after a decided turn shows, in both wire formats,
        // the calls made so far with the arguments that ran.
        let requests: Vec<ModelRequest> = provider.requests();
        prop_assert_eq!(requests.len(), turns.len() + 1);
        let mut made = 0;
        for (k, request) in requests.iter().enumerate().skip(1) {
            made += turns[k - 1].len();
            let shown: Vec<(String, Value)> = expected[..made]
                .iter()
                .map(|(_, s)| ("refund".to_owned(), s.clone()))
                .collect();
            prop_assert_eq!(
                &anthropic_uses(&Anthropic::default().body(request, true)),
                &shown,
                "anthropic, request {}",
                k
            );
            prop_assert_eq!(
                &openai_uses(&OpenAi::default().body(request, true)),
                &shown,
                "openai, request {}",
                k
            );
        }
        // Replay agrees with the live conversation.
        prop_assert_eq!(&RunState::replay(state.run_id, &log).unwrap(), &state);
        Ok(())
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn the_next_request_shows_the_arguments_that_ran(turns in turns()) {
        check(turns)?;
    }
}

#[test]
fn an_edit_replaces_the_call_in_the_next_request() {
    // A fixed case, so a failure reads plainly: the model proposes 3000,
    // the approver edits to 10; the next request shows 10, never 3000.
    let edit = json!({ "order": "A1", "amount": 10 });
    check(vec![vec![(
        json!({ "order": "A1", "amount": 3000 }),
        Choice::Edit(edit),
    )]])
    .unwrap();
}
