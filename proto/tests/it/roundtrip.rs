//! JSON round trips of the contract's types are exact: parsing what was
//! serialised gives the same value, and serialising that again gives the same
//! bytes.
//!
//! JSON numbers are generated as `i64` / `u64` only, so float formatting cannot
//! make equality flaky. `Option<Value>` fields are never `Some(Value::Null)`:
//! serde reads a JSON `null` as `None`, so that one value cannot round-trip
//! (see `option_of_null_reads_back_as_none`).

use std::collections::BTreeSet;
use std::fmt::Debug;

use chrono::{DateTime, Utc};
use glia_proto::{
    AgentRef, ApprovalTimeout, BudgetLimits, BudgetUsage, CompactionSpec, CompactionStrategy,
    ContentBlock, Decision, DecisionChoice, Disposition, Event, EventKind, GuardrailStage,
    Guardrails, HookEffect, HookTopic, ImageSource, InterruptedCall, Limit, LiveEvent, Message,
    Outcome, PauseReason, Payload, PlannerKind, Policy, PolicyAction, Pricing, PullPoint,
    RejectedAnswer, ResultBlock, Retry, Role, RunConfig, StopAction, StopClass, StopPolicy,
    TextRule, ToolCallRecord, ToolContent, ToolErrorKind, ToolSpec, Usage,
};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestRunner;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use uuid::Uuid;

// ----- strategies ------------------------------------------------------------

/// Strings that stress the encoder: empty, plain, escapes, markers, emoji and
/// arbitrary Unicode (control characters included).
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        "[a-z_.]{1,12}",
        Just("⟦glia:synthetic⟧ \"quoted\"\n\t\\ ✓ 🦀 \u{0}".to_owned()),
        "\\PC{0,16}",
        any::<String>(),
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        text().prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(text(), inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// An optional JSON value that is never `Some(Value::Null)`.
fn optional_json() -> impl Strategy<Value = Option<Value>> {
    prop::option::of(json_value().prop_filter("Some(null) reads back as None", |v| !v.is_null()))
}

fn uuid() -> impl Strategy<Value = Uuid> {
    any::<u128>().prop_map(Uuid::from_u128)
}

/// Any instant from year 1 to year 9999, to the nanosecond.
fn instant() -> impl Strategy<Value = DateTime<Utc>> {
    (-62_135_596_800i64..=253_402_300_799, 0u32..1_000_000_000)
        .prop_map(|(secs, nanos)| DateTime::from_timestamp(secs, nanos).expect("in chrono's range"))
}

fn role() -> impl Strategy<Value = Role> {
    prop_oneof![Just(Role::User), Just(Role::Assistant)]
}

/// Tool result content: a string, or blocks (any text, images of any
/// media type and data — the contract keeps them as given).
fn tool_content() -> impl Strategy<Value = ToolContent> {
    let block = prop_oneof![
        text().prop_map(|text| ResultBlock::Text { text }),
        (text(), text()).prop_map(|(media_type, data)| ResultBlock::Image {
            source: ImageSource::Base64 { media_type, data }
        }),
    ];
    prop_oneof![
        text().prop_map(ToolContent::Text),
        prop::collection::vec(block, 0..4).prop_map(ToolContent::Blocks)
    ]
}

fn content_block() -> impl Strategy<Value = ContentBlock> {
    prop_oneof![
        text().prop_map(|text| ContentBlock::Text { text }),
        (text(), text(), json_value()).prop_map(|(id, name, input)| ContentBlock::ToolUse {
            id,
            name,
            input
        }),
        (text(), tool_content(), any::<bool>()).prop_map(|(tool_use_id, content, is_error)| {
            ContentBlock::ToolResult {
                tool_use_id,
                content,
                is_error,
            }
        }),
        (text(), text()).prop_map(|(thinking, signature)| ContentBlock::Thinking {
            thinking,
            signature
        }),
        text().prop_map(|data| ContentBlock::RedactedThinking { data }),
    ]
}

fn message() -> impl Strategy<Value = Message> {
    (role(), prop::collection::vec(content_block(), 0..4))
        .prop_map(|(role, content)| Message { role, content })
}

fn usage() -> impl Strategy<Value = Usage> {
    (
        any::<u64>(),
        any::<u64>(),
        any::<u64>(),
        any::<u64>(),
        any::<bool>(),
    )
        .prop_map(
            |(input_tokens, output_tokens, cache_write_tokens, cache_read_tokens, estimated)| {
                Usage {
                    input_tokens,
                    output_tokens,
                    cache_write_tokens,
                    cache_read_tokens,
                    estimated,
                }
            },
        )
}

fn choice() -> impl Strategy<Value = DecisionChoice> {
    prop_oneof![
        Just(DecisionChoice::Approve),
        Just(DecisionChoice::Reject),
        Just(DecisionChoice::Edit)
    ]
}

fn budget_limits() -> impl Strategy<Value = BudgetLimits> {
    let o = || prop::option::of(any::<u64>());
    (o(), o(), o(), o(), o(), o(), o(), o()).prop_map(
        |(
            max_turns,
            max_tool_calls,
            max_active_ms,
            max_input_tokens,
            max_output_tokens,
            max_cache_write_tokens,
            max_cache_read_tokens,
            max_cost_usd_micros,
        )| {
            BudgetLimits {
                max_turns,
                max_tool_calls,
                max_active_ms,
                max_input_tokens,
                max_output_tokens,
                max_cache_write_tokens,
                max_cache_read_tokens,
                max_cost_usd_micros,
            }
        },
    )
}

fn budget_usage() -> impl Strategy<Value = BudgetUsage> {
    (
        any::<u64>(),
        any::<u64>(),
        any::<u64>(),
        usage(),
        any::<u64>(),
    )
        .prop_map(
            |(turns, tool_calls, active_ms, tokens, cost_usd_micros)| BudgetUsage {
                turns,
                tool_calls,
                active_ms,
                tokens,
                cost_usd_micros,
            },
        )
}

fn limit() -> impl Strategy<Value = Limit> {
    prop_oneof![
        Just(Limit::Turns),
        Just(Limit::ToolCalls),
        Just(Limit::ActiveTime),
        Just(Limit::InputTokens),
        Just(Limit::OutputTokens),
        Just(Limit::CacheWriteTokens),
        Just(Limit::CacheReadTokens),
        Just(Limit::Cost),
    ]
}

fn pricing() -> impl Strategy<Value = Pricing> {
    (any::<u64>(), any::<u64>(), any::<u64>(), any::<u64>()).prop_map(
        |(input, output, cache_write, cache_read)| Pricing {
            input,
            output,
            cache_write,
            cache_read,
        },
    )
}

fn tool_spec() -> impl Strategy<Value = ToolSpec> {
    (
        text(),
        text(),
        json_value(),
        any::<bool>(),
        any::<u64>(),
        any::<bool>(),
    )
        .prop_map(
            |(name, description, input_schema, idempotent, timeout_ms, external)| ToolSpec {
                name,
                description,
                input_schema,
                idempotent,
                timeout_ms,
                external,
                return_direct: false,
                cancel_grace_ms: timeout_ms / 2,
                source: None,
                policy: None,
                max_result_bytes: None,
                output_schema: None,
            },
        )
}

fn policy() -> impl Strategy<Value = Policy> {
    let action = prop_oneof![
        Just(PolicyAction::Allow),
        text().prop_map(|reason| PolicyAction::Deny { reason }),
        Just(PolicyAction::RequireApproval),
        text().prop_map(|text| PolicyAction::Remind { text }),
    ];
    (text(), prop::option::of(text()), action).prop_map(|(tool, args, action)| Policy {
        tool,
        args,
        action,
    })
}

fn run_config() -> impl Strategy<Value = RunConfig> {
    let tools = (
        text(),
        text(),
        prop::option::of(prop::collection::vec(text(), 0..3)),
        prop::collection::vec(tool_spec(), 0..3),
        prop::collection::vec(policy(), 0..3),
    );
    let knobs = (
        budget_limits(),
        any::<u32>(),
        any::<bool>(),
        prop_oneof![Just(PlannerKind::Single), Just(PlannerKind::Model)],
        optional_json(),
        any::<u32>(),
        prop::option::of(pricing()),
        any::<u32>(),
    );
    let approvals = (
        prop::option::of(any::<u64>()),
        prop_oneof![
            Just(ApprovalTimeout::Reject),
            Just(ApprovalTimeout::Escalate)
        ],
        prop_oneof![
            Just(InterruptedCall::OutcomeUnknown),
            Just(InterruptedCall::RequireApproval)
        ],
        (
            stop_action(),
            stop_action(),
            stop_action(),
            stop_action(),
            stop_action(),
            stop_action(),
        )
            .prop_map(
                |(truncated, empty, refusal, content_filter, context_window, unknown)| StopPolicy {
                    truncated,
                    empty,
                    refusal,
                    content_filter,
                    context_window,
                    unknown,
                },
            ),
        prop_oneof![
            Just((Guardrails::default(), None, None)),
            Just(agent_parts())
        ],
    );
    (tools, knobs, approvals).prop_map(
        |(
            (model, system, tools, external_tools, policies),
            (
                budget,
                max_model_calls_per_turn,
                conversational,
                planner,
                output_schema,
                max_reasks,
                pricing,
                max_tokens,
            ),
            (
                approval_timeout_ms,
                on_approval_timeout,
                on_interrupted_call,
                stop_reasons,
                (guardrails, compaction, agent),
            ),
        )| RunConfig {
            model,
            system,
            tools,
            external_tools,
            policies,
            budget,
            max_model_calls_per_turn,
            conversational,
            planner,
            output_schema,
            max_reasks,
            pricing,
            max_tokens,
            approval_timeout_ms,
            on_approval_timeout,
            on_interrupted_call,
            stop_reasons,
            guardrails,
            compaction,
            agent,
            ..RunConfig::default()
        },
    )
}

/// Declarative guardrails, compaction and an agent stamp, as a definition resolves them.
fn agent_parts() -> (Guardrails, Option<CompactionSpec>, Option<AgentRef>) {
    let rule = TextRule {
        name: "no-digits".into(),
        deny: Some(r"\d+".into()),
        reason: Some("no numbers".into()),
        ..TextRule::default()
    };
    let guardrails = Guardrails {
        input: vec![rule.clone()],
        output: vec![rule.clone()],
        tool_results: vec![rule],
        max_input_chars: Some(10),
        max_output_chars: None,
    };
    let compaction = CompactionSpec {
        strategy: CompactionStrategy::Summarize,
        max_tokens: 1000,
        keep_recent: 1,
    };
    (
        guardrails,
        Some(compaction),
        Some(AgentRef {
            name: "a".into(),
            version: 2,
            content_hash: "sha256:00".into(),
        }),
    )
}

fn stop_action() -> impl Strategy<Value = StopAction> {
    prop_oneof![
        Just(StopAction::Reask),
        Just(StopAction::Pause),
        Just(StopAction::Fail)
    ]
}

fn rejected_answer() -> impl Strategy<Value = RejectedAnswer> {
    let class = prop_oneof![
        Just(StopClass::Answer),
        Just(StopClass::ToolUse),
        Just(StopClass::Truncated),
        Just(StopClass::Empty),
        Just(StopClass::Refusal),
        Just(StopClass::ContentFilter),
        Just(StopClass::ContextWindow),
        Just(StopClass::Unknown),
    ];
    let turn = prop_oneof![
        Just(glia_proto::ProtectedTurn::Goal),
        Just(glia_proto::ProtectedTurn::LatestHumanTurn)
    ];
    let refused = prop::option::of(
        (0usize..50, turn).prop_map(|(index, turn)| glia_proto::RefusedTurn { index, turn }),
    );
    (class, stop_action(), prop::option::of(text()), refused).prop_map(
        |(class, action, reask, refused_turn)| RejectedAnswer {
            class,
            action,
            reask,
            refused_turn,
        },
    )
}

fn disposition() -> impl Strategy<Value = Disposition> {
    prop_oneof![
        prop::option::of(text()).prop_map(|reminder| Disposition::Run { reminder }),
        Just(Disposition::External),
        Just(Disposition::Approval),
        Just(Disposition::Child),
        (tool_error_kind(), text())
            .prop_map(|(error, message)| Disposition::Refused { error, message }),
        wait().prop_map(|wait| Disposition::Wait { wait }),
    ]
}

// issue 32: waits
fn wait() -> impl Strategy<Value = glia_proto::Wait> {
    prop_oneof![
        (any::<i64>(), any::<i64>()).prop_map(|(started_at_ms, wake_at_ms)| {
            glia_proto::Wait::Timer {
                started_at_ms,
                wake_at_ms,
            }
        }),
        (text(), any::<i64>(), any::<i64>()).prop_map(|(key, started_at_ms, timeout_at_ms)| {
            glia_proto::Wait::Event {
                key,
                started_at_ms,
                timeout_at_ms,
            }
        }),
    ]
}

fn tool_error_kind() -> impl Strategy<Value = ToolErrorKind> {
    prop::sample::select(vec![
        ToolErrorKind::UnknownTool,
        ToolErrorKind::Unavailable,
        ToolErrorKind::InvalidArguments,
        ToolErrorKind::Failed,
        ToolErrorKind::InvalidOutput,
        ToolErrorKind::Panicked,
        ToolErrorKind::Timeout,
        ToolErrorKind::Denied,
        ToolErrorKind::Rejected,
        ToolErrorKind::Cancelled,
        ToolErrorKind::OutcomeUnknown,
        ToolErrorKind::BudgetExceeded,
        ToolErrorKind::Expired,
    ])
}

fn decision() -> impl Strategy<Value = Decision> {
    prop_oneof![
        Just(Decision::Approve),
        text().prop_map(|reason| Decision::Reject { reason }),
        json_value().prop_map(|input| Decision::Edit { input }),
        Just(Decision::Expire),
    ]
}

fn call_ids() -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec(text(), 0..3)
}

fn pause_reason() -> impl Strategy<Value = PauseReason> {
    prop_oneof![
        limit().prop_map(|limit| PauseReason::Budget { limit }),
        Just(PauseReason::TurnLimit),
        (text(), text()).prop_map(|(hook, reason)| PauseReason::Hook { hook, reason }),
        text().prop_map(|reason| PauseReason::Provider { reason }),
        text().prop_map(|reason| PauseReason::Operator { reason }),
        text().prop_map(|stop_reason| PauseReason::ModelStop { stop_reason }),
        (text(), text()).prop_map(|(server, reason)| PauseReason::ToolSource { server, reason }),
    ]
}

fn pull_point() -> impl Strategy<Value = PullPoint> {
    prop_oneof![
        call_ids().prop_map(|call_ids| PullPoint::AwaitingTool { call_ids }),
        call_ids().prop_map(|call_ids| PullPoint::AwaitingApproval { call_ids }),
        Just(PullPoint::AwaitingInput),
        pause_reason().prop_map(|reason| PullPoint::Paused { reason }),
        (call_ids(), any::<i64>()).prop_map(|(call_ids, wake_at_ms)| PullPoint::AwaitingTimer {
            call_ids,
            wake_at_ms
        }),
        (
            call_ids(),
            prop::collection::vec(text(), 0..3),
            prop::option::of(any::<i64>())
        )
            .prop_map(|(call_ids, keys, timeout_at_ms)| PullPoint::AwaitingEvent {
                call_ids,
                keys,
                timeout_at_ms
            }),
        call_ids().prop_map(|call_ids| PullPoint::AwaitingChildren { call_ids }),
    ]
}

fn outcome() -> impl Strategy<Value = Outcome> {
    prop_oneof![
        (text(), optional_json())
            .prop_map(|(answer, output)| Outcome::Succeeded { answer, output }),
        text().prop_map(|error| Outcome::Failed { error }),
        text().prop_map(|reason| Outcome::Cancelled { reason }),
    ]
}

fn hook_topic() -> impl Strategy<Value = HookTopic> {
    prop::sample::select(HookTopic::ALL.to_vec())
}

fn hook_effect() -> impl Strategy<Value = HookEffect> {
    prop_oneof![
        json_value().prop_map(|payload| HookEffect::Modified { payload }),
        text().prop_map(|reason| HookEffect::Cancelled { reason }),
        Just(HookEffect::Skipped),
        Just(HookEffect::Continued),
        text().prop_map(|reason| HookEffect::Paused { reason }),
    ]
}

fn steps() -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec(text(), 0..4)
}

fn event_kind() -> impl Strategy<Value = EventKind> {
    prop_oneof![
        (text(), run_config()).prop_map(|(goal, config)| EventKind::SessionStart {
            redactions: Vec::new(),
            goal,
            config
        }),
        (steps(), usage(), any::<u64>()).prop_map(|(steps, usage, cost_usd_micros)| {
            EventKind::PlanDraft {
                steps,
                usage,
                cost_usd_micros,
            }
        }),
        steps().prop_map(|steps| EventKind::PlanCommit { steps }),
        (
            any::<usize>(),
            text(),
            prop::collection::vec(tool_spec(), 0..3)
        )
            .prop_map(|(index, description, tools)| EventKind::StepStart {
                index,
                description,
                tools
            }),
        (any::<usize>(), text(), any::<bool>()).prop_map(|(index, answer, skipped)| {
            EventKind::StepEnd {
                index,
                answer,
                skipped,
            }
        }),
        (
            text(),
            any::<usize>(),
            any::<bool>(),
            prop::option::of(text())
        )
            .prop_map(|(model, messages, wrap_up, forced_tool)| {
                EventKind::ModelCall {
                    model,
                    messages,
                    wrap_up,
                    forced_tool,
                }
            }),
        (any::<u32>(), text(), text(), any::<u64>()).prop_map(
            |(attempt, cause, message, delay_ms)| EventKind::ModelRetry(Retry {
                attempt,
                cause,
                message,
                delay_ms
            })
        ),
        (any::<usize>(), text())
            .prop_map(|(index, reason)| EventKind::MessageElided { index, reason }),
        (
            message(),
            usage(),
            text(),
            any::<u64>(),
            any::<u64>(),
            prop::option::of(rejected_answer())
        )
            .prop_map(
                |(message, usage, stop_reason, duration_ms, cost_usd_micros, rejected)| {
                    EventKind::ModelResponse {
                        redactions: Vec::new(),
                        message,
                        usage,
                        stop_reason,
                        duration_ms,
                        cost_usd_micros,
                        rejected,
                    }
                }
            ),
        (text(), text(), json_value(), text(), text(), disposition()).prop_map(
            |(call_id, name, input, args_hash, idempotency_key, disposition)| EventKind::ToolCall(
                ToolCallRecord {
                    call_id,
                    name,
                    input,
                    args_hash,
                    idempotency_key,
                    disposition,
                }
            )
        ),
        (
            text(),
            tool_content(),
            prop::option::of(text()),
            any::<u64>(),
            prop::collection::vec((text(), any::<usize>()), 0..2)
        )
            .prop_map(|(call_id, content, reminder, duration_ms, redactions)| {
                let redactions = redactions
                    .into_iter()
                    .map(|(guardrail, count)| glia_proto::Redaction { guardrail, count })
                    .collect();
                EventKind::ToolResult {
                    call_id,
                    content,
                    reminder,
                    duration_ms,
                    redactions,
                }
            }),
        (text(), tool_error_kind(), text(), any::<u64>()).prop_map(
            |(call_id, error, message, duration_ms)| EventKind::ToolError {
                call_id,
                error,
                message,
                duration_ms
            }
        ),
        (text(), text(), json_value(), text()).prop_map(|(call_id, tool, input, args_hash)| {
            EventKind::ApprovalRequested {
                call_id,
                tool,
                input,
                args_hash,
                expires_at: Some(DateTime::UNIX_EPOCH),
                interrupted: false,
            }
        }),
        (text(), text(), decision(), prop::option::of(text())).prop_map(
            |(call_id, args_hash, decision, by)| EventKind::ApprovalResolved {
                call_id,
                args_hash,
                decision,
                by
            }
        ),
        text().prop_map(|text| EventKind::InputReceived {
            redactions: Vec::new(),
            text
        }),
        (
            prop_oneof![
                Just(GuardrailStage::Input),
                Just(GuardrailStage::Output),
                Just(GuardrailStage::ToolResult)
            ],
            text(),
            text(),
            prop::option::of(text())
        )
            .prop_map(
                |(stage, guardrail, reason, reask)| EventKind::GuardrailTripped {
                    stage,
                    guardrail,
                    reason,
                    reask
                }
            ),
        (
            text(),
            any::<usize>(),
            prop::collection::vec(message(), 0..3),
            usage(),
            any::<u64>()
        )
            .prop_map(|(strategy, removed, messages, usage, cost_usd_micros)| {
                EventKind::ContextCompacted {
                    strategy,
                    removed,
                    messages,
                    usage,
                    cost_usd_micros,
                }
            }),
        (limit(), budget_usage(), budget_limits()).prop_map(|(limit, usage, limits)| {
            EventKind::BudgetWarn {
                limit,
                usage,
                limits,
            }
        }),
        budget_limits().prop_map(|limits| EventKind::BudgetExtended { limits }),
        pull_point().prop_map(|pull_point| EventKind::SessionPause { pull_point }),
        prop::option::of(text()).prop_map(|by| EventKind::SessionResume { by }),
        text().prop_map(|reason| EventKind::SessionCancel { reason }),
        outcome().prop_map(|outcome| EventKind::SessionComplete { outcome }),
        (text(), any::<bool>()).prop_map(|(message, fatal)| EventKind::Error { message, fatal }),
        (
            hook_topic(),
            text(),
            hook_effect(),
            prop::option::of((text(), any::<u64>()))
        )
            .prop_map(|(topic, hook, effect, call)| {
                EventKind::HookApplied {
                    topic,
                    hook,
                    effect,
                    call: call.map(|(key, duration_ms)| glia_proto::HookCall {
                        key,
                        outcome: glia_proto::HookOutcome::TimedOut,
                        duration_ms,
                    }),
                }
            }),
        text().prop_map(|call_id| EventKind::ApprovalEscalated {
            call_id,
            expires_at: Some(DateTime::UNIX_EPOCH)
        }),
        (text(), prop::option::of(text()), choice()).prop_map(|(call_id, by, chose)| {
            EventKind::ApprovalContested {
                call_id,
                by,
                chose,
                attempted_at: DateTime::UNIX_EPOCH,
            }
        }),
        (text(), prop::option::of(text()))
            .prop_map(|(reason, by)| EventKind::SessionPauseRequested { reason, by }),
        (text(), text()).prop_map(|(call_id, idempotency_key)| EventKind::ToolRecovered {
            call_id,
            idempotency_key
        }),
        (text(), text(), 1u32..20, prop::option::of(0u64..60_000)).prop_map(
            |(server, reason, attempt, retry_in_ms)| EventKind::ToolSourceUnavailable {
                server,
                reason,
                attempt,
                retry_in_ms,
            }
        ),
        (
            prop::collection::vec(text(), 0..3),
            prop::collection::vec(text(), 0..3),
            prop::collection::vec(text(), 0..3),
        )
            .prop_map(|(added, removed, changed)| EventKind::ToolsChanged {
                added,
                removed,
                changed,
            }),
        (
            text(),
            prop::option::of(uuid()),
            text(),
            outcome(),
            usage(),
            any::<u64>()
        )
            .prop_map(
                |(call_id, child_run_id, agent, outcome, usage, cost_usd_micros)| {
                    EventKind::ChildEnded {
                        call_id,
                        child_run_id,
                        agent,
                        outcome,
                        usage,
                        cost_usd_micros,
                    }
                }
            ),
    ]
}

fn event() -> impl Strategy<Value = Event> {
    (uuid(), any::<u64>(), instant(), event_kind()).prop_map(|(run_id, seq, at, kind)| Event {
        run_id,
        seq,
        at,
        kind,
    })
}

fn resume() -> impl Strategy<Value = Payload> {
    prop_oneof![
        (text(), text(), decision(), prop::option::of(text())).prop_map(
            |(call_id, args_hash, decision, by)| Payload::Approval {
                call_id,
                args_hash,
                decision,
                by,
                request_seq: None
            }
        ),
        (text(), text(), any::<bool>()).prop_map(|(call_id, content, is_error)| {
            Payload::ToolResult {
                call_id,
                content,
                is_error,
            }
        }),
        text().prop_map(|text| Payload::Input {
            text,
            redactions: Vec::new()
        }),
        budget_limits().prop_map(|extra| Payload::ExtendBudget { extra }),
        prop::option::of(text()).prop_map(|by| Payload::Resume { by }),
        prop::option::of(text()).prop_map(|text| Payload::Close {
            text,
            redactions: Vec::new()
        }),
        text().prop_map(|reason| Payload::Cancel { reason }),
        (text(), prop::option::of(any::<u64>())).prop_map(|(call_id, request_seq)| {
            Payload::Escalate {
                call_id,
                request_seq,
                expires_at: Some(DateTime::UNIX_EPOCH),
            }
        }),
        (text(), prop::option::of(text())).prop_map(|(reason, by)| Payload::Pause { reason, by }),
        (text(), prop::option::of(text()), choice()).prop_map(|(call_id, by, chose)| {
            Payload::ApprovalContested {
                call_id,
                by,
                chose,
                attempted_at: DateTime::UNIX_EPOCH,
            }
        }),
        (
            any::<i64>(),
            prop::option::of((any::<u128>(), text(), text(), any::<i64>()))
        )
            .prop_map(|(due_at_ms, event)| Payload::Wake {
                due_at_ms,
                event: event.map(|(id, key, payload, received_at_ms)| {
                    glia_proto::ArrivedEvent {
                        id: Uuid::from_u128(id),
                        key,
                        payload: json!({ "text": payload }),
                        received_at_ms,
                    }
                }),
            }),
        (
            text(),
            prop::option::of(uuid()),
            outcome(),
            usage(),
            any::<u64>()
        )
            .prop_map(|(call_id, child_run_id, outcome, usage, cost_usd_micros)| {
                Payload::ChildEnded {
                    call_id,
                    child_run_id,
                    outcome,
                    usage,
                    cost_usd_micros,
                }
            }),
    ]
}

// ----- the property ----------------------------------------------------------

/// Serialise, parse, compare; serialise again, compare the bytes.
fn assert_round_trip<T>(value: &T) -> Result<(), TestCaseError>
where
    T: Serialize + DeserializeOwned + PartialEq + Debug,
{
    let json =
        serde_json::to_string(value).map_err(|e| TestCaseError::fail(format!("serialise: {e}")))?;
    let back: T = serde_json::from_str(&json)
        .map_err(|e| TestCaseError::fail(format!("parse {json}: {e}")))?;
    prop_assert_eq!(&back, value, "JSON: {}", json);
    let again = serde_json::to_string(&back)
        .map_err(|e| TestCaseError::fail(format!("serialise again: {e}")))?;
    prop_assert_eq!(again, json);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn content_blocks_round_trip(block in content_block()) {
        assert_round_trip(&block)?;
    }

    #[test]
    fn tool_contents_round_trip(content in tool_content()) {
        assert_round_trip(&content)?;
    }

    #[test]
    fn messages_round_trip(message in message()) {
        assert_round_trip(&message)?;
    }

    #[test]
    fn usage_round_trips(usage in usage()) {
        assert_round_trip(&usage)?;
    }

    #[test]
    fn events_round_trip(event in event()) {
        assert_round_trip(&event)?;
    }

    #[test]
    fn run_configs_round_trip(config in run_config()) {
        assert_round_trip(&config)?;
    }

    #[test]
    fn budget_limits_round_trip(limits in budget_limits()) {
        assert_round_trip(&limits)?;
    }

    #[test]
    fn pull_points_round_trip(pull_point in pull_point()) {
        assert_round_trip(&pull_point)?;
    }

    #[test]
    fn resumes_round_trip(resume in resume()) {
        assert_round_trip(&resume)?;
    }

    /// A whole log, as one JSON array, round-trips too.
    #[test]
    fn event_logs_round_trip(log in prop::collection::vec(event(), 0..6)) {
        assert_round_trip(&log)?;
    }
}

// ----- coverage of the catalogue ---------------------------------------------

/// The position of `kind`'s variant in [`event_kind`]. Exhaustive on purpose:
/// a new variant does not compile until it is given a strategy and an index.
fn variant_index(kind: &EventKind) -> usize {
    match kind {
        EventKind::SessionStart { .. } => 0,
        EventKind::PlanDraft { .. } => 1,
        EventKind::PlanCommit { .. } => 2,
        EventKind::StepStart { .. } => 3,
        EventKind::StepEnd { .. } => 4,
        EventKind::ModelCall { .. } => 5,
        EventKind::ModelResponse { .. } => 6,
        EventKind::ToolCall(_) => 7,
        EventKind::ToolResult { .. } => 8,
        EventKind::ToolError { .. } => 9,
        EventKind::ApprovalRequested { .. } => 10,
        EventKind::ApprovalResolved { .. } => 11,
        EventKind::InputReceived { .. } => 12,
        EventKind::GuardrailTripped { .. } => 13,
        EventKind::ContextCompacted { .. } => 14,
        EventKind::BudgetWarn { .. } => 15,
        EventKind::BudgetExtended { .. } => 16,
        EventKind::SessionPause { .. } => 17,
        EventKind::SessionResume { .. } => 18,
        EventKind::SessionCancel { .. } => 19,
        EventKind::SessionComplete { .. } => 20,
        EventKind::Error { .. } => 21,
        EventKind::HookApplied { .. } => 22,
        EventKind::ModelRetry(_) => 23,
        EventKind::MessageElided { .. } => 24,
        EventKind::ApprovalEscalated { .. } => 25,
        EventKind::SessionPauseRequested { .. } => 26,
        EventKind::ToolRecovered { .. } => 27,
        EventKind::ToolSourceUnavailable { .. } => 28,
        EventKind::ToolsChanged { .. } => 29,
        EventKind::ApprovalContested { .. } => 30,
        EventKind::ChildEnded { .. } => 31,
    }
}

/// The same for [`resume`].
fn resume_variant_index(resume: &Payload) -> usize {
    match resume {
        Payload::Approval { .. } => 0,
        Payload::ToolResult { .. } => 1,
        Payload::Input { .. } => 2,
        Payload::ExtendBudget { .. } => 3,
        Payload::Resume { .. } => 4,
        Payload::Close { .. } => 5,
        Payload::Cancel { .. } => 6,
        Payload::Escalate { .. } => 7,
        Payload::Pause { .. } => 8,
        Payload::ApprovalContested { .. } => 9,
        Payload::Wake { .. } => 10,
        Payload::ChildEnded { .. } => 11,
    }
}

/// The variant indices `strategy` produces over a fixed sample.
fn variants_seen<T: Debug>(
    strategy: impl Strategy<Value = T>,
    index: fn(&T) -> usize,
) -> BTreeSet<usize> {
    let mut runner = TestRunner::deterministic();
    (0..2_000)
        .map(|_| index(&strategy.new_tree(&mut runner).expect("a value").current()))
        .collect()
}

#[test]
fn the_strategies_cover_every_variant() {
    assert_eq!(
        variants_seen(event_kind(), variant_index),
        (0..32).collect()
    );
    assert_eq!(
        variants_seen(resume(), resume_variant_index),
        (0..12).collect()
    );
}

// ----- the wire format, pinned -----------------------------------------------

fn envelope(kind: EventKind) -> Event {
    Event {
        run_id: Uuid::nil(),
        seq: 7,
        at: DateTime::UNIX_EPOCH,
        kind,
    }
}

#[test]
fn a_tool_call_serialises_with_its_dotted_name() {
    let event = envelope(EventKind::ToolCall(ToolCallRecord {
        call_id: "call_1".into(),
        name: "add".into(),
        input: json!({"a": 1, "b": 2}),
        args_hash: glia_proto::args_hash(&json!({"a": 1, "b": 2})),
        idempotency_key: "run:call_1".into(),
        disposition: Disposition::Run { reminder: None },
    }));
    let value = serde_json::to_value(&event).unwrap();
    assert_eq!(value["type"], "tool.call");
    assert_eq!(value["seq"], 7);
    assert_eq!(value["run_id"], "00000000-0000-0000-0000-000000000000");
    assert_eq!(value["at"], "1970-01-01T00:00:00Z");
    assert_eq!(value["data"]["call_id"], "call_1");
    assert_eq!(
        value["data"]["disposition"],
        json!({"kind": "run", "reminder": null})
    );
    let text = serde_json::to_string(&event).unwrap();
    assert!(text.contains(r#""type":"tool.call""#), "{text}");
}

#[test]
fn every_event_serialises_under_its_name() {
    let kinds = [
        EventKind::SessionStart {
            redactions: Vec::new(),
            goal: "hi".into(),
            config: RunConfig::default(),
        },
        EventKind::ModelCall {
            model: "m".into(),
            messages: 1,
            wrap_up: false,
            forced_tool: None,
        },
        EventKind::ApprovalResolved {
            call_id: "c".into(),
            args_hash: "h".into(),
            decision: Decision::Approve,
            by: None,
        },
        EventKind::SessionPause {
            pull_point: PullPoint::AwaitingInput,
        },
        EventKind::SessionComplete {
            outcome: Outcome::Failed { error: "x".into() },
        },
        EventKind::Error {
            message: "boom".into(),
            fatal: true,
        },
        EventKind::HookApplied {
            topic: HookTopic::BeforeToolCall,
            hook: "h".into(),
            effect: HookEffect::Skipped,
            call: None,
        },
        EventKind::ModelRetry(Retry {
            attempt: 1,
            cause: "rate_limited".into(),
            message: "slow down".into(),
            delay_ms: 3000,
        }),
        EventKind::MessageElided {
            index: 2,
            reason: "provider refusal".into(),
        },
        EventKind::ApprovalEscalated {
            call_id: "c".into(),
            expires_at: None,
        },
        EventKind::ToolRecovered {
            call_id: "c".into(),
            idempotency_key: "r:1:c".into(),
        },
        EventKind::ToolSourceUnavailable {
            server: "files".into(),
            reason: "down".into(),
            attempt: 1,
            retry_in_ms: Some(1000),
        },
        EventKind::ToolsChanged {
            added: vec!["b".into()],
            removed: vec!["a".into()],
            changed: vec!["c".into()],
        },
        EventKind::ChildEnded {
            call_id: "c".into(),
            child_run_id: Some(Uuid::nil()),
            agent: "refund@2".into(),
            outcome: Outcome::Succeeded {
                answer: "refunded".into(),
                output: None,
            },
            usage: Usage::default(),
            cost_usd_micros: 10,
        },
    ];
    let expected = [
        "session.start",
        "model.call",
        "approval.resolved",
        "session.pause",
        "session.complete",
        "error",
        "hook.applied",
        "model.retry",
        "message.elided",
        "approval.escalated",
        "tool.recovered",
        "tool_source.unavailable",
        "tools.changed",
        "child.ended",
    ];
    for (kind, name) in kinds.into_iter().zip(expected) {
        assert_eq!(kind.name(), name);
        let value = serde_json::to_value(envelope(kind)).unwrap();
        assert_eq!(value["type"], name, "{value}");
    }
}

#[test]
fn a_pause_event_has_the_documented_shape() {
    let event = envelope(EventKind::SessionPause {
        pull_point: PullPoint::AwaitingApproval {
            call_ids: vec!["call_2".into()],
        },
    });
    assert_eq!(
        serde_json::to_value(&event).unwrap(),
        json!({
            "run_id": "00000000-0000-0000-0000-000000000000",
            "seq": 7,
            "at": "1970-01-01T00:00:00Z",
            "type": "session.pause",
            "data": {"pull_point": {"kind": "awaiting_approval", "call_ids": ["call_2"]}},
        })
    );
}

#[test]
fn a_rejected_answer_with_estimated_usage_has_the_documented_shape() {
    let event = envelope(EventKind::ModelResponse {
        redactions: Vec::new(),
        message: Message::assistant("The answer is par"),
        usage: Usage {
            input_tokens: 12,
            output_tokens: 5,
            estimated: true,
            ..Usage::default()
        },
        stop_reason: "max_tokens".into(),
        duration_ms: 9,
        cost_usd_micros: 0,
        rejected: Some(RejectedAnswer {
            class: StopClass::Truncated,
            action: StopAction::Reask,
            reask: Some("again".into()),
            refused_turn: None,
        }),
    });
    let v = serde_json::to_value(&event).unwrap();
    assert_eq!(
        v["data"]["usage"],
        json!({"input_tokens": 12, "output_tokens": 5, "cache_write_tokens": 0, "cache_read_tokens": 0, "estimated": true})
    );
    assert_eq!(
        v["data"]["rejected"],
        json!({"class": "truncated", "action": "reask", "reask": "again"})
    );
    // An accepted answer with reported usage keeps the shape it always had.
    let plain = envelope(EventKind::ModelResponse {
        redactions: Vec::new(),
        message: Message::assistant("4"),
        usage: Usage::default(),
        stop_reason: "end_turn".into(),
        duration_ms: 9,
        cost_usd_micros: 0,
        rejected: None,
    });
    let v = serde_json::to_value(&plain).unwrap();
    assert!(
        v["data"].get("rejected").is_none() && v["data"]["usage"].get("estimated").is_none(),
        "{v}"
    );
    let pause = PauseReason::ModelStop {
        stop_reason: "refusal".into(),
    };
    assert_eq!(
        serde_json::to_value(&pause).unwrap(),
        json!({"kind": "model_stop", "stop_reason": "refusal"})
    );
}

/// Pins the one value that does not round-trip, so a change in serde's
/// behaviour is noticed: `Some(Value::Null)` in an `Option<Value>` field is
/// written as `null` and read back as `None`.
#[test]
fn option_of_null_reads_back_as_none() {
    let outcome = Outcome::Succeeded {
        answer: "a".into(),
        output: Some(Value::Null),
    };
    let back: Outcome = serde_json::from_str(&serde_json::to_string(&outcome).unwrap()).unwrap();
    assert_eq!(
        back,
        Outcome::Succeeded {
            answer: "a".into(),
            output: None
        }
    );
}

#[test]
fn retries_elisions_and_discards_have_the_documented_shape() {
    let retry = envelope(EventKind::ModelRetry(Retry {
        attempt: 2,
        cause: "overloaded".into(),
        message: "busy".into(),
        delay_ms: 1500,
    }));
    assert_eq!(
        serde_json::to_value(&retry).unwrap()["data"],
        json!({"attempt": 2, "cause": "overloaded", "message": "busy", "delay_ms": 1500})
    );
    let elided = envelope(EventKind::MessageElided {
        index: 3,
        reason: "provider refusal".into(),
    });
    assert_eq!(
        serde_json::to_value(&elided).unwrap()["data"],
        json!({"index": 3, "reason": "provider refusal"})
    );
    let discard = LiveEvent::ModelDiscard {
        attempt: 1,
        cause: "stream_cut".into(),
    };
    let value = serde_json::to_value(&discard).unwrap();
    assert_eq!(
        value,
        json!({"type": "model.discard", "data": {"attempt": 1, "cause": "stream_cut"}})
    );
    assert_eq!(serde_json::from_value::<LiveEvent>(value).unwrap(), discard);
    let block = ContentBlock::RedactedThinking {
        data: "EmwKAhgB".into(),
    };
    assert_eq!(
        serde_json::to_value(&block).unwrap(),
        json!({"type": "redacted_thinking", "data": "EmwKAhgB"})
    );
}

/// Logs written before tool results could hold images store `"content"` as
/// a string: it reads back as text and is written back byte for byte.
#[test]
fn a_stored_text_result_reads_as_text_and_writes_back_unchanged() {
    let stored = r#"{"type":"tool.result","data":{"call_id":"c1","content":"{\"refunded\":30}","reminder":null,"duration_ms":1}}"#;
    let kind: EventKind = serde_json::from_str(stored).unwrap();
    assert_eq!(
        kind,
        EventKind::ToolResult {
            call_id: "c1".into(),
            content: ToolContent::Text("{\"refunded\":30}".into()),
            reminder: None,
            duration_ms: 1,
            redactions: Vec::new()
        }
    );
    assert_eq!(serde_json::to_string(&kind).unwrap(), stored);
    let block = r#"{"type":"tool_result","tool_use_id":"t1","content":"ok","is_error":false}"#;
    let parsed: ContentBlock = serde_json::from_str(block).unwrap();
    assert_eq!(
        parsed,
        ContentBlock::ToolResult {
            tool_use_id: "t1".into(),
            content: "ok".into(),
            is_error: false
        }
    );
    assert_eq!(serde_json::to_string(&parsed).unwrap(), block);
}

/// A result with an image is Anthropic's `tool_result` with a list of
/// content blocks.
#[test]
fn a_result_with_an_image_has_the_documented_shape() {
    let content = ToolContent::Blocks(vec![
        ResultBlock::Text {
            text: "a tiny image".into(),
        },
        ResultBlock::Image {
            source: ImageSource::Base64 {
                media_type: "image/png".into(),
                data: "iVBORw0KGgo=".into(),
            },
        },
    ]);
    let block = ContentBlock::ToolResult {
        tool_use_id: "t1".into(),
        content,
        is_error: false,
    };
    let value = serde_json::to_value(&block).unwrap();
    assert_eq!(
        value,
        json!({"type": "tool_result", "tool_use_id": "t1", "is_error": false, "content": [
            {"type": "text", "text": "a tiny image"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
        ]})
    );
    assert_eq!(
        serde_json::from_value::<ContentBlock>(value).unwrap(),
        block
    );
    // An image block of an unknown source type is refused, not read as text.
    let url = json!({"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "image", "source": {"type": "url", "url": "https://x"}}]});
    assert!(serde_json::from_value::<ContentBlock>(url).is_err());
}

/// The catalogue is one list: every event kind the generator produces (it
/// covers every variant) serialises with `type` equal to its
/// [`EventKind::name`], that name is in [`EventKind::NAMES`], and every name
/// there is produced; the kinds that carry spend are exactly
/// [`EventKind::SPEND_NAMES`].
#[test]
fn the_catalogue_names_every_serialised_tag_and_every_spend_kind() {
    let mut runner = TestRunner::deterministic();
    let strategy = event_kind();
    let mut seen = BTreeSet::new();
    let mut spending = BTreeSet::new();
    for _ in 0..4000 {
        let kind = strategy.new_tree(&mut runner).unwrap().current();
        let value = serde_json::to_value(&kind).unwrap();
        assert_eq!(value["type"], kind.name(), "{value}");
        assert!(
            EventKind::NAMES.contains(&kind.name()),
            "{} is missing from EventKind::NAMES",
            kind.name()
        );
        assert_eq!(
            kind.carries_spend(),
            EventKind::SPEND_NAMES.contains(&kind.name()),
            "{}",
            kind.name()
        );
        if kind.carries_spend() {
            spending.insert(kind.name());
        }
        seen.insert(kind.name());
    }
    let all: BTreeSet<&str> = EventKind::NAMES.into_iter().collect();
    assert_eq!(all.len(), EventKind::NAMES.len(), "a name is listed twice");
    assert_eq!(seen, all, "every catalogue name is generated");
    let spend: BTreeSet<&str> = EventKind::SPEND_NAMES.into_iter().collect();
    assert_eq!(spending, spend);
}
