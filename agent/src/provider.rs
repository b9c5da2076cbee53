//! The offline providers, beside the provider boundary they implement
//! (defined in [`glia_proto::provider`], re-exported here for the loop's
//! users).
//!
//! [`ScriptedProvider`] is the offline, deterministic provider. It serves a
//! script of responses in order and checks every request the way the real
//! APIs do, panicking on a violation so the whole test suite guards the
//! "every request is valid" invariant.

use std::sync::Mutex;

use async_trait::async_trait;
pub use glia_proto::provider::{
    ModelRequest, ModelResponse, Provider, ProviderError, ToolChoice, validate_request,
};
use glia_proto::{ContentBlock, LiveEvent, Message, Retry, Role, Usage};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One scripted response. JSON: `{"text": "…"}`, `{"tool_calls": [{"name":
/// "lookup", "input": {…}}]}`, `{"thinking": "…", "text": "…"}`, or
/// `{"error": "transient"}` (also `rate_limited`, `spend_cap`, `auth`,
/// `invalid`, `malformed`). `stop_reason` makes the answer stop for that
/// reason (`max_tokens`, `refusal`, …; see [`glia_proto::stop`]). `retries` and `elided` make the answer report failed attempts
/// and elided request messages, as a real provider would.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ScriptedTurn {
    /// Thinking block text.
    pub thinking: Option<String>,
    /// Text block.
    pub text: Option<String>,
    /// Tool uses, in order.
    pub tool_calls: Vec<ScriptedCall>,
    /// Usage to report; when absent, estimated as characters / 4 and marked
    /// [`Usage::estimated`].
    pub usage: Option<Usage>,
    /// Stop reason; default `tool_use` when there are tool calls, else `end_turn`.
    pub stop_reason: Option<String>,
    /// Fail this call instead of answering.
    pub error: Option<String>,
    /// Failed attempts to report before the answer (each also streams a
    /// [`LiveEvent::ModelDiscard`]).
    pub retries: Vec<Retry>,
    /// Request message indices to report as elided.
    pub elided: Vec<usize>,
}

impl ScriptedTurn {
    /// A text answer.
    pub fn text(text: &str) -> Self {
        ScriptedTurn {
            text: Some(text.into()),
            ..Default::default()
        }
    }

    /// A turn that calls one tool.
    pub fn call(name: &str, input: Value) -> Self {
        ScriptedTurn {
            tool_calls: vec![ScriptedCall {
                id: None,
                name: name.into(),
                input,
            }],
            ..Default::default()
        }
    }

    /// A turn that calls several tools at once.
    pub fn calls(calls: &[(&str, Value)]) -> Self {
        ScriptedTurn {
            tool_calls: calls
                .iter()
                .map(|(n, i)| ScriptedCall {
                    id: None,
                    name: (*n).into(),
                    input: i.clone(),
                })
                .collect(),
            ..Default::default()
        }
    }
}

/// One scripted tool use.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedCall {
    /// Call id; default `call_{n}` counting from 1 across the script.
    #[serde(default)]
    pub id: Option<String>,
    /// Tool name.
    pub name: String,
    /// Arguments.
    #[serde(default = "empty_object")]
    pub input: Value,
}

fn empty_object() -> Value {
    Value::Object(Default::default())
}

/// The offline provider. Thread-safe; serves turns in order.
#[derive(Debug, Default)]
pub struct ScriptedProvider {
    turns: Vec<ScriptedTurn>,
    state: Mutex<ScriptState>,
    text_only: bool,
}

#[derive(Debug, Default)]
struct ScriptState {
    next: usize,
    calls: usize,
    requests: Vec<ModelRequest>,
}

impl ScriptedProvider {
    /// A provider serving `turns` in order.
    pub fn new(turns: Vec<ScriptedTurn>) -> Self {
        ScriptedProvider {
            turns,
            state: Mutex::default(),
            text_only: false,
        }
    }

    /// A provider whose model takes no images
    /// ([`Provider::takes_images`] false): a request carrying an image
    /// panics, as a text-only model's API would reject it.
    pub fn text_only(mut self) -> Self {
        self.text_only = true;
        self
    }

    /// Skip the first `n` turns, as if they had been served: a provider for a
    /// run resumed in a fresh process after `n` model calls. Default call ids
    /// continue counting from the skipped turns.
    pub fn starting_at(self, n: usize) -> Self {
        let calls = self.turns.iter().take(n).map(|t| t.tool_calls.len()).sum();
        let n = n.min(self.turns.len());
        ScriptedProvider {
            turns: self.turns,
            state: Mutex::new(ScriptState {
                next: n,
                calls,
                requests: Vec::new(),
            }),
            text_only: self.text_only,
        }
    }

    /// Parse a script file's JSON: an array of [`ScriptedTurn`].
    pub fn from_json(json: &str) -> Result<Self, serde_json::Error> {
        Ok(Self::new(serde_json::from_str(json)?))
    }

    /// Every request received so far, in order.
    pub fn requests(&self) -> Vec<ModelRequest> {
        self.state
            .lock()
            .expect("scripted provider lock")
            .requests
            .clone()
    }

    /// Turns served so far.
    pub fn served(&self) -> usize {
        self.state.lock().expect("scripted provider lock").next
    }
}

fn estimate_tokens(text_len: usize) -> u64 {
    (text_len as u64).div_ceil(4)
}

#[async_trait]
impl Provider for ScriptedProvider {
    fn takes_images(&self, _model: &str) -> bool {
        !self.text_only
    }

    async fn generate(
        &self,
        request: &ModelRequest,
        live: &(dyn Fn(LiveEvent) + Send + Sync),
    ) -> Result<ModelResponse, ProviderError> {
        if self.text_only
            && let Some(image) = request
                .messages
                .iter()
                .flat_map(|m| &m.content)
                .find_map(|b| match b {
                    ContentBlock::ToolResult { content, .. } => content.images().next(),
                    _ => None,
                })
        {
            panic!(
                "scripted provider: a text-only model was sent an image ({})",
                image.describe()
            );
        }
        if let Err(why) = validate_request(request) {
            panic!(
                "scripted provider: the request would be rejected by the provider: {why}\nmessages: {}",
                serde_json::to_string_pretty(&request.messages).unwrap_or_default()
            );
        }
        let (turn, first_call) = {
            let mut st = self.state.lock().expect("scripted provider lock");
            st.requests.push(request.clone());
            let Some(turn) = self.turns.get(st.next).cloned() else {
                return Err(ProviderError::ScriptExhausted(st.next));
            };
            st.next += 1;
            let first = st.calls;
            st.calls += turn.tool_calls.len();
            (turn, first)
        };
        if let Some(kind) = &turn.error {
            return Err(match kind.as_str() {
                "rate_limited" => ProviderError::RateLimited {
                    retry_after_ms: 1000,
                },
                "spend_cap" => ProviderError::SpendCap("scripted spending cap".into()),
                "invalid" => ProviderError::InvalidRequest("scripted invalid request".into()),
                "auth" => ProviderError::Auth("scripted invalid API key".into()),
                "malformed" => ProviderError::Malformed("scripted malformed answer".into()),
                other => ProviderError::transient(format!("scripted {other} failure")),
            });
        }
        for retry in &turn.retries {
            live(LiveEvent::ModelDelta {
                channel: "text".into(),
                delta: "(an attempt that fails) ".into(),
            });
            live(LiveEvent::ModelDiscard {
                attempt: retry.attempt,
                cause: retry.cause.clone(),
            });
        }
        let mut content = Vec::new();
        if let Some(thinking) = &turn.thinking {
            live(LiveEvent::ModelDelta {
                channel: "thinking".into(),
                delta: thinking.clone(),
            });
            content.push(ContentBlock::Thinking {
                thinking: thinking.clone(),
                signature: "scripted".into(),
            });
        }
        if let Some(text) = &turn.text {
            for piece in text.split_inclusive(' ') {
                live(LiveEvent::ModelDelta {
                    channel: "text".into(),
                    delta: piece.to_owned(),
                });
            }
            content.push(ContentBlock::Text { text: text.clone() });
        }
        for (i, call) in turn.tool_calls.iter().enumerate() {
            let id = call
                .id
                .clone()
                .unwrap_or_else(|| format!("call_{}", first_call + i + 1));
            live(LiveEvent::ModelDelta {
                channel: "tool_call".into(),
                delta: call.name.clone(),
            });
            content.push(ContentBlock::ToolUse {
                id,
                name: call.name.clone(),
                input: call.input.clone(),
            });
        }
        if content.is_empty() {
            content.push(ContentBlock::text("(no answer)"));
        }
        let message = Message {
            role: Role::Assistant,
            content,
        };
        let usage = turn.usage.unwrap_or_else(|| Usage {
            input_tokens: estimate_tokens(
                serde_json::to_string(&request.messages).map_or(0, |s| s.len())
                    + request.system.len(),
            ),
            output_tokens: estimate_tokens(serde_json::to_string(&message).map_or(0, |s| s.len())),
            estimated: true,
            ..Usage::default()
        });
        let stop_reason = turn.stop_reason.clone().unwrap_or_else(|| {
            if turn.tool_calls.is_empty() {
                "end_turn".into()
            } else {
                "tool_use".into()
            }
        });
        Ok(ModelResponse {
            message,
            usage,
            stop_reason,
            retries: turn.retries,
            elided: turn.elided,
            refused_turn: None,
        })
    }
}

/// One script of a [`ScriptLibrary`]: the turns every run gets (a JSON
/// array of [`ScriptedTurn`]), or turns chosen by the run's goal:
/// `{"by_goal": [{"contains": "A1", "turns": […]}, …], "otherwise": […]}`
/// — the first entry whose `contains` is in the request's first user
/// message, else `otherwise` (without it, such a request is refused). So a
/// scripted model can answer each case of an eval dataset its own way.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum Script {
    /// The same turns for every run.
    Turns(Vec<ScriptedTurn>),
    /// Turns by goal.
    ByGoal {
        /// Tried in order.
        by_goal: Vec<GoalScript>,
        /// For a goal no entry matches.
        #[serde(default)]
        otherwise: Option<Vec<ScriptedTurn>>,
    },
}

/// The turns of a [`Script::ByGoal`] for goals containing `contains`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GoalScript {
    /// Matched against the request's first user message (case-sensitive).
    pub contains: String,
    /// The turns served.
    pub turns: Vec<ScriptedTurn>,
}

impl Script {
    /// The turns for a request whose first user message is `goal`.
    fn turns(&self, goal: &str) -> Option<&[ScriptedTurn]> {
        match self {
            Script::Turns(turns) => Some(turns),
            Script::ByGoal { by_goal, otherwise } => by_goal
                .iter()
                .find(|s| goal.contains(&s.contains))
                .map(|s| s.turns.as_slice())
                .or(otherwise.as_deref()),
        }
    }
}

/// Scripts by name, served statelessly: a request for model `script:NAME`
/// gets turn *k* of script `NAME` (its turns for the request's goal, see
/// [`Script`]), where *k* is the number of assistant turns already in the
/// request. Any worker, in any process, after any restart,
/// answers a run's request the same way, which is what a fleet of stateless
/// workers needs. Default call ids are `call_{k}_{i}`.
///
/// Unlike [`ScriptedProvider`] it does not panic on an invalid request: it
/// answers [`ProviderError::InvalidRequest`], so the run fails loudly with
/// the reason in its log and the worker process stays up.
#[derive(Debug, Clone, Default)]
pub struct ScriptLibrary {
    scripts: std::collections::HashMap<String, Script>,
}

impl ScriptLibrary {
    /// Add (or replace) the script `name`, the same turns for every run.
    pub fn insert(&mut self, name: &str, turns: Vec<ScriptedTurn>) -> &mut Self {
        self.insert_script(name, Script::Turns(turns))
    }

    /// Add (or replace) the script `name`.
    pub fn insert_script(&mut self, name: &str, script: Script) -> &mut Self {
        self.scripts.insert(name.to_owned(), script);
        self
    }

    /// Every `*.json` file of `dir` (a [`Script`]: a JSON array of
    /// [`ScriptedTurn`], or turns by goal), named by its file stem. Errors
    /// name the file that failed.
    pub fn from_dir(dir: &std::path::Path) -> Result<Self, String> {
        let mut lib = ScriptLibrary::default();
        let entries =
            std::fs::read_dir(dir).map_err(|e| format!("reading {}: {e}", dir.display()))?;
        for entry in entries {
            let path = entry.map_err(|e| e.to_string())?.path();
            if path.extension().is_some_and(|x| x == "json") {
                let text = std::fs::read_to_string(&path)
                    .map_err(|e| format!("reading {}: {e}", path.display()))?;
                let script = serde_json::from_str(&text).map_err(|e| {
                    format!(
                        "parsing {}: {e} (a script is an array of turns or {{\"by_goal\": [{{\"contains\", \"turns\"}}], \"otherwise\"?}})",
                        path.display()
                    )
                })?;
                let name = path
                    .file_stem()
                    .and_then(|s| s.to_str())
                    .unwrap_or_default()
                    .to_owned();
                lib.insert_script(&name, script);
            }
        }
        Ok(lib)
    }
}

#[async_trait]
impl Provider for ScriptLibrary {
    async fn generate(
        &self,
        request: &ModelRequest,
        live: &(dyn Fn(LiveEvent) + Send + Sync),
    ) -> Result<ModelResponse, ProviderError> {
        validate_request(request).map_err(ProviderError::InvalidRequest)?;
        let name = request
            .model
            .strip_prefix("script:")
            .unwrap_or(&request.model);
        let script = self
            .scripts
            .get(name)
            .ok_or_else(|| ProviderError::InvalidRequest(format!("no script named {name:?}")))?;
        let goal = request
            .messages
            .iter()
            .find(|m| m.role == Role::User)
            .map(Message::text)
            .unwrap_or_default();
        let script = script.turns(&goal).ok_or_else(|| {
            ProviderError::InvalidRequest(format!(
                "script {name:?} has no turns for this goal (no by_goal entry matches and no otherwise)"
            ))
        })?;
        let k = request
            .messages
            .iter()
            .filter(|m| m.role == Role::Assistant)
            .count();
        let mut turn = script
            .get(k)
            .cloned()
            .ok_or(ProviderError::ScriptExhausted(k))?;
        for (i, call) in turn.tool_calls.iter_mut().enumerate() {
            call.id.get_or_insert_with(|| format!("call_{k}_{}", i + 1));
        }
        ScriptedProvider::new(vec![turn])
            .generate(request, live)
            .await
    }
}

/// A provider whose models take no images ([`Provider::takes_images`]
/// false), every call passed to the one inside: a catalogue provider
/// marked `images = false`.
pub struct TextOnly(pub std::sync::Arc<dyn Provider>);

#[async_trait]
impl Provider for TextOnly {
    async fn generate(
        &self,
        request: &ModelRequest,
        live: &(dyn Fn(LiveEvent) + Send + Sync),
    ) -> Result<ModelResponse, ProviderError> {
        self.0.generate(request, live).await
    }

    fn pricing(&self, model: &str) -> Option<glia_proto::Pricing> {
        self.0.pricing(model)
    }

    fn takes_images(&self, _model: &str) -> bool {
        false
    }
}
