//! Planners: what steps a run takes, and what happens after each.
//!
//! The default [`SinglePlanner`] commits one implicit step, so the plain loop
//! (model → tools → model … → answer) is the common case. [`ModelPlanner`]
//! asks the model for a list of steps through a forced tool call, and after
//! each step asks it for the remaining steps (the same list, a new list, or
//! none when the goal is met).

use async_trait::async_trait;
use glia_proto::{LiveEvent, Message, RunState, ToolSpec, Usage};
use serde_json::json;

use crate::provider::{ModelRequest, Provider, ProviderError, ToolChoice};

/// The implicit step of the default planner.
pub const IMPLICIT_STEP: &str = "Reach the goal.";

/// A drafted plan.
#[derive(Debug, Clone, PartialEq)]
pub struct Draft {
    /// Step descriptions; empty means nothing to do.
    pub steps: Vec<String>,
    /// Tokens the planner used.
    pub usage: Usage,
}

/// What to do after a step.
#[derive(Debug, Clone, PartialEq)]
pub enum Reflection {
    /// Start the next committed step.
    Next,
    /// Replace the remaining steps (empty = done).
    Replan(Draft),
    /// The goal is met.
    Done,
}

/// Why planning failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// The model call failed.
    #[error(transparent)]
    Provider(#[from] ProviderError),
    /// The model's plan is unusable.
    #[error("invalid plan from the model: {0}")]
    Invalid(String),
}

/// A planner.
#[async_trait]
pub trait Planner: Send + Sync {
    /// Draft the plan for `state.goal`.
    async fn draft(&self, state: &RunState, provider: &dyn Provider) -> Result<Draft, PlanError>;
    /// Decide what follows the step that just ended.
    async fn reflect(
        &self,
        state: &RunState,
        provider: &dyn Provider,
    ) -> Result<Reflection, PlanError>;
}

/// One implicit step; done after it.
#[derive(Debug, Clone, Copy, Default)]
pub struct SinglePlanner;

#[async_trait]
impl Planner for SinglePlanner {
    async fn draft(&self, _state: &RunState, _provider: &dyn Provider) -> Result<Draft, PlanError> {
        Ok(Draft {
            steps: vec![IMPLICIT_STEP.to_owned()],
            usage: Usage::default(),
        })
    }

    async fn reflect(
        &self,
        state: &RunState,
        _provider: &dyn Provider,
    ) -> Result<Reflection, PlanError> {
        let next = state.step.map_or(0, |s| s + 1);
        Ok(if next < state.plan.len() {
            Reflection::Next
        } else {
            Reflection::Done
        })
    }
}

/// Name of the planner's forced tool.
pub const PLAN_TOOL: &str = "submit_plan";

/// Plans (and replans) through the model.
#[derive(Debug, Clone, Copy, Default)]
pub struct ModelPlanner;

impl ModelPlanner {
    async fn ask(
        &self,
        state: &RunState,
        provider: &dyn Provider,
        prompt: String,
    ) -> Result<Draft, PlanError> {
        let tool = ToolSpec {
            name: PLAN_TOOL.into(),
            description: "Submit the steps that remain to reach the goal, in order. An empty list means the goal is met.".into(),
            input_schema: json!({"type": "object", "properties": {"steps": {"type": "array", "items": {"type": "string", "minLength": 1}}}, "required": ["steps"]}),
            idempotent: true,
            timeout_ms: 0,
            external: false,
            return_direct: false,
            cancel_grace_ms: glia_proto::DEFAULT_CANCEL_GRACE_MS,
            source: None,
            policy: None,
            max_result_bytes: None,
            output_schema: None,
        };
        let request = ModelRequest {
            model: state.config.model.clone(),
            system: "You plan work for an agent. Break the goal into a few concrete steps and submit them.".into(),
            messages: vec![Message::user(prompt)],
            tools: vec![tool],
            tool_choice: ToolChoice::Tool { name: PLAN_TOOL.into() },
            max_tokens: 1024,
        };
        let ignore = |_: LiveEvent| {};
        let response = provider.generate(&request, &ignore).await?;
        let Some((_, _, input)) = response
            .message
            .tool_uses()
            .find(|(_, name, _)| *name == PLAN_TOOL)
        else {
            return Err(PlanError::Invalid(format!(
                "the model did not call {PLAN_TOOL}"
            )));
        };
        let steps: Vec<String> = input
            .get("steps")
            .and_then(|s| s.as_array())
            .ok_or_else(|| {
                PlanError::Invalid(format!(
                    "{PLAN_TOOL}: `steps` must be an array, got {input}"
                ))
            })?
            .iter()
            .map(|s| {
                s.as_str()
                    .filter(|s| !s.trim().is_empty())
                    .map(str::to_owned)
            })
            .collect::<Option<_>>()
            .ok_or_else(|| {
                PlanError::Invalid(format!(
                    "{PLAN_TOOL}: every step must be a non-empty string, got {input}"
                ))
            })?;
        Ok(Draft {
            steps,
            usage: response.usage,
        })
    }
}

#[async_trait]
impl Planner for ModelPlanner {
    async fn draft(&self, state: &RunState, provider: &dyn Provider) -> Result<Draft, PlanError> {
        self.ask(state, provider, format!("Goal: {}", state.goal))
            .await
    }

    async fn reflect(
        &self,
        state: &RunState,
        provider: &dyn Provider,
    ) -> Result<Reflection, PlanError> {
        let done = state.step.map_or(0, |s| s + 1);
        let remaining = state.plan.get(done..).unwrap_or_default();
        let prompt = format!(
            "Goal: {}\nCompleted step: {}\nIts result: {}\nRemaining plan: {}\nSubmit the steps that remain (an empty list if the goal is met).",
            state.goal,
            state
                .step
                .and_then(|s| state.plan.get(s))
                .map_or("", String::as_str),
            state.answer,
            serde_json::to_string(remaining).unwrap_or_default()
        );
        let draft = self.ask(state, provider, prompt).await?;
        Ok(
            if draft.steps.is_empty() && draft.usage == Usage::default() {
                Reflection::Done
            } else {
                Reflection::Replan(draft)
            },
        )
    }
}
