//! Hooks: interceptors on the ten topics of the harness contract.
//!
//! Subscribers of a topic run in registration order; each sees the payload as
//! the previous one left it and returns a [`Verdict`]. The first verdict other
//! than `Continue` ends the chain. Every change, cancel, skip or pause is
//! returned as a [`HookEffect`] that the loop records as a `hook.applied`
//! event, so replaying a log never runs a hook again.
//!
//! What each topic's payload is and which verdicts it honours:
//!
//! | topic | payload | a change to | Cancel | Skip | Pause |
//! |---|---|---|---|---|---|
//! | before_plan | `{goal}` | – | cancels the run | uses the single implicit step | parks the run as paused |
//! | after_plan | `{steps}` | `steps` is committed | cancels the run | – | parks the run as paused |
//! | before_step | `{index, description}` | `description` | cancels the run | skips the step | parks the run as paused |
//! | after_step | `{index, answer}` | – | cancels the run | – | parks the run as paused |
//! | before_tool_call | `{call_id, name, input}` | `input` runs | refuses the call | refuses the call | – |
//! | after_tool_call | `{call_id, name, content, is_error}` | `content` is recorded | – | – | – |
//! | on_error, on_pause, on_budget_exceeded, on_complete | the event's data | – | – | – | – |
//!
//! A verdict a topic does not honour is ignored and not recorded. The
//! operator catalogue's HTTP hooks ([`crate::http_hooks`], `docs/hooks.md`)
//! run after these on the same topics, with the same table; their answers,
//! `continue` included, are recorded so that a resumed run never asks them
//! again.

use glia_proto::{HookEffect, HookTopic};
use serde_json::Value;

/// A subscriber's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Go on (with the payload as the hook left it).
    Continue,
    /// Cancel what the topic is about to do.
    Cancel(String),
    /// Skip what the topic is about to do.
    Skip,
    /// Ask for human review: the run parks as paused.
    Pause(String),
}

type HookFn = Box<dyn Fn(&mut Value) -> Verdict + Send + Sync>;

/// Subscribers by topic, in registration order.
#[derive(Default)]
pub struct Hooks {
    subscribers: Vec<(HookTopic, String, HookFn)>,
}

/// The result of firing a topic.
#[derive(Debug, Clone, PartialEq)]
pub struct Fired {
    /// The payload after every subscriber that ran.
    pub payload: Value,
    /// The verdict that ended the chain (`Continue` if none did).
    pub verdict: Verdict,
    /// `(hook name, effect)` to record, in order.
    pub effects: Vec<(String, HookEffect)>,
}

impl Hooks {
    /// Subscribe `hook` (named `name` in the log) to `topic`.
    ///
    /// ```
    /// use glia_agent::hooks::{Hooks, Verdict};
    /// use glia_proto::HookTopic;
    /// let mut hooks = Hooks::default();
    /// hooks.on(HookTopic::BeforeToolCall, "no-rm", |p| {
    ///     if p["input"].to_string().contains("rm -rf") { Verdict::Cancel("destructive".into()) } else { Verdict::Continue }
    /// });
    /// let fired = hooks.fire(HookTopic::BeforeToolCall, serde_json::json!({"input": {"cmd": "rm -rf /"}}));
    /// assert_eq!(fired.verdict, Verdict::Cancel("destructive".into()));
    /// ```
    pub fn on(
        &mut self,
        topic: HookTopic,
        name: &str,
        hook: impl Fn(&mut Value) -> Verdict + Send + Sync + 'static,
    ) -> &mut Self {
        self.subscribers
            .push((topic, name.to_owned(), Box::new(hook)));
        self
    }

    /// Run `topic`'s subscribers over `payload`. Which verdicts take effect is
    /// the caller's (the loop's) business, per the table in the module docs.
    pub fn fire(&self, topic: HookTopic, mut payload: Value) -> Fired {
        let mut effects = Vec::new();
        for (t, name, hook) in &self.subscribers {
            if *t != topic {
                continue;
            }
            let before = payload.clone();
            let verdict = hook(&mut payload);
            if payload != before {
                effects.push((
                    name.clone(),
                    HookEffect::Modified {
                        payload: payload.clone(),
                    },
                ));
            }
            let effect = match &verdict {
                Verdict::Continue => continue,
                Verdict::Cancel(reason) => HookEffect::Cancelled {
                    reason: reason.clone(),
                },
                Verdict::Skip => HookEffect::Skipped,
                Verdict::Pause(reason) => HookEffect::Paused {
                    reason: reason.clone(),
                },
            };
            effects.push((name.clone(), effect));
            return Fired {
                payload,
                verdict,
                effects,
            };
        }
        Fired {
            payload,
            verdict: Verdict::Continue,
            effects,
        }
    }
}
