//! Tools: a typed trait whose JSON Schema comes from the argument type, an
//! object-safe form for tools whose shape is only known at run time (MCP,
//! recorded tools), and the registry that validates, times out and isolates
//! every call.
//!
//! A call never crashes the loop: invalid arguments, an error, a panic, a
//! timeout or output that is not JSON all become a [`ToolFailure`] that the
//! model sees as an error result.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use glia_proto::{ToolErrorKind, ToolSpec};
use schemars::JsonSchema;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use uuid::Uuid;

/// What a tool is told about the call it serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolContext {
    /// The run.
    pub run_id: Uuid,
    /// The call id.
    pub call_id: String,
    /// `{run_id}:{call_id}`: the same on a re-run after a crash, so an
    /// idempotent tool can recognise a repeat.
    pub idempotency_key: String,
}

/// A failed call: the kind, and the text the model sees.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind:?}: {message}")]
pub struct ToolFailure {
    /// Why.
    pub kind: ToolErrorKind,
    /// Shown to the model as the error result.
    pub message: String,
}

impl ToolFailure {
    /// A tool-reported failure ([`ToolErrorKind::Failed`]).
    pub fn failed(message: impl Into<String>) -> Self {
        ToolFailure {
            kind: ToolErrorKind::Failed,
            message: message.into(),
        }
    }
}

/// A tool with typed arguments. The schema the model sees is derived from
/// `Args` with schemars, and arguments are validated against it before `call`.
///
/// ```
/// use glia_agent::tool::{Tool, ToolContext, ToolFailure, ToolRegistry};
/// #[derive(serde::Deserialize, schemars::JsonSchema)]
/// struct AddArgs { a: i64, b: i64 }
/// struct Add;
/// impl Tool for Add {
///     type Args = AddArgs;
///     type Output = i64;
///     fn name(&self) -> &str { "add" }
///     fn description(&self) -> &str { "Add two integers." }
///     async fn call(&self, args: AddArgs, _ctx: ToolContext) -> Result<i64, ToolFailure> { Ok(args.a + args.b) }
/// }
/// let mut tools = ToolRegistry::default();
/// tools.register(Add);
/// assert_eq!(tools.spec("add").unwrap().input_schema["required"], serde_json::json!(["a", "b"]));
/// ```
pub trait Tool: Send + Sync + 'static {
    /// Arguments; their JSON Schema is the tool's input schema.
    type Args: DeserializeOwned + JsonSchema + Send;
    /// Result, serialised to JSON for the model.
    type Output: Serialize;
    /// Name the model calls it by.
    fn name(&self) -> &str;
    /// What it does, for the model.
    fn description(&self) -> &str;
    /// Safe to run again with the same idempotency key. Default: no.
    fn idempotent(&self) -> bool {
        false
    }
    /// How long a call may take. Default: 30 s.
    fn timeout(&self) -> Duration {
        Duration::from_secs(30)
    }
    /// How long a call already running when its run is cancelled may go on
    /// so that its result is recorded (see [`ToolSpec::cancel_grace_ms`]).
    /// Default: [`glia_proto::DEFAULT_CANCEL_GRACE_MS`].
    fn cancel_grace(&self) -> Duration {
        Duration::from_millis(glia_proto::DEFAULT_CANCEL_GRACE_MS)
    }
    /// Run the call.
    fn call(
        &self,
        args: Self::Args,
        ctx: ToolContext,
    ) -> impl Future<Output = Result<Self::Output, ToolFailure>> + Send;
}

/// The object-safe tool form: raw JSON in, raw text out. Implement this for
/// tools defined at run time; the registry validates `input` against
/// `spec().input_schema` first, and checks that the output parses as JSON
/// when `spec()` says so via [`DynTool::returns_json`].
pub trait DynTool: Send + Sync + 'static {
    /// Name, description, schema, idempotency and timeout.
    fn spec(&self) -> ToolSpec;
    /// True when the output must be valid JSON. Default: yes.
    fn returns_json(&self) -> bool {
        true
    }
    /// Run the call with already-validated arguments.
    fn call_raw(
        &self,
        input: Value,
        ctx: ToolContext,
    ) -> BoxFuture<'static, Result<String, ToolFailure>>;
}

struct Typed<T>(Arc<T>);

impl<T: Tool> DynTool for Typed<T> {
    fn spec(&self) -> ToolSpec {
        let schema = schemars::schema_for!(T::Args);
        let mut input_schema = schema.to_value();
        if let Some(obj) = input_schema.as_object_mut() {
            obj.remove("$schema");
            obj.remove("title");
        }
        ToolSpec {
            name: self.0.name().to_owned(),
            description: self.0.description().to_owned(),
            input_schema,
            idempotent: self.0.idempotent(),
            timeout_ms: u64::try_from(self.0.timeout().as_millis()).unwrap_or(u64::MAX),
            external: false,
            return_direct: false,
            cancel_grace_ms: u64::try_from(self.0.cancel_grace().as_millis()).unwrap_or(u64::MAX),
            source: None,
            policy: None,
            max_result_bytes: None,
            output_schema: None,
        }
    }

    fn call_raw(
        &self,
        input: Value,
        ctx: ToolContext,
    ) -> BoxFuture<'static, Result<String, ToolFailure>> {
        let tool = self.0.clone();
        async move {
            let args: T::Args = serde_json::from_value(input).map_err(|e| ToolFailure {
                kind: ToolErrorKind::InvalidArguments,
                message: format!("arguments do not match the schema: {e}"),
            })?;
            let out = tool.call(args, ctx).await?;
            serde_json::to_string(&out).map_err(|e| ToolFailure {
                kind: ToolErrorKind::InvalidOutput,
                message: format!("tool output is not serialisable as JSON: {e}"),
            })
        }
        .boxed()
    }
}

/// Check a tool call's arguments: a JSON object its input schema accepts.
///
/// The provider adapters hand over arguments that did not parse as a JSON
/// object as a JSON string holding the raw text, so a string is reported as
/// malformed JSON (with the parser's reason) or as JSON of the wrong type.
/// Errors: the text the model sees as the call's error result, naming every
/// problem (`5 is not of type "string" at '/ticker'`) and asking it to call
/// again.
pub fn check_arguments(
    name: &str,
    validator: &jsonschema::Validator,
    input: &Value,
) -> Result<(), String> {
    let again = format!("Call {name} again with a JSON object matching its input schema.");
    let problem = match input {
        Value::Object(_) => {
            let problems: Vec<String> = validator
                .iter_errors(input)
                .map(|e| match e.instance_path().to_string() {
                    at if at.is_empty() => e.to_string(),
                    at => format!("{e} at '{at}'"),
                })
                .collect();
            if problems.is_empty() {
                return Ok(());
            }
            problems.join("; ")
        }
        Value::String(raw) => match serde_json::from_str::<Value>(raw) {
            Err(e) => format!("the arguments are not valid JSON ({e}): {}", clip(raw, 200)),
            Ok(v) => format!(
                "the arguments must be a JSON object, not {}",
                glia_proto::json_type(&v)
            ),
        },
        other => format!(
            "the arguments must be a JSON object, not {}",
            glia_proto::json_type(other)
        ),
    };
    Err(format!("Invalid arguments for {name}: {problem}. {again}"))
}

/// At most `max` characters of `text`, with `…` when cut.
fn clip(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        text.to_owned()
    } else {
        format!("{}…", text.chars().take(max).collect::<String>())
    }
}

/// A tool's task, aborted when its call is given up (timed out, or dropped).
struct AbortOnDrop(tokio::task::JoinHandle<Result<String, ToolFailure>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

struct Entry {
    tool: Arc<dyn DynTool>,
    spec: ToolSpec,
    validator: Arc<jsonschema::Validator>,
}

/// The tools a worker can run, by name. Registration compiles each schema
/// once; a schema that does not compile is refused.
#[derive(Default)]
pub struct ToolRegistry {
    tools: BTreeMap<String, Entry>,
}

/// A registration that could not be accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    /// The input schema is not a valid JSON Schema.
    #[error("tool {tool}: invalid input schema: {reason}")]
    InvalidSchema {
        /// Tool name.
        tool: String,
        /// Why.
        reason: String,
    },
}

impl ToolRegistry {
    /// Register a typed tool. Panics if its derived schema does not compile,
    /// which is a bug in the argument type, not bad input.
    pub fn register<T: Tool>(&mut self, tool: T) -> &mut Self {
        self.register_dyn(Arc::new(Typed(Arc::new(tool))))
            .expect("a schemars-derived schema compiles");
        self
    }

    /// Register a run-time tool. Replaces a tool of the same name.
    pub fn register_dyn(&mut self, tool: Arc<dyn DynTool>) -> Result<&mut Self, RegistryError> {
        let spec = tool.spec();
        let validator = jsonschema::validator_for(&spec.input_schema).map_err(|e| {
            RegistryError::InvalidSchema {
                tool: spec.name.clone(),
                reason: e.to_string(),
            }
        })?;
        self.tools.insert(
            spec.name.clone(),
            Entry {
                tool,
                spec,
                validator: Arc::new(validator),
            },
        );
        Ok(self)
    }

    /// The spec of a registered tool.
    pub fn spec(&self, name: &str) -> Option<&ToolSpec> {
        self.tools.get(name).map(|e| &e.spec)
    }

    /// All specs, sorted by name.
    pub fn specs(&self) -> Vec<ToolSpec> {
        self.tools.values().map(|e| e.spec.clone()).collect()
    }

    /// Run one call: validate `input`, run the tool on its own task under its
    /// timeout, check the output. Every failure is a [`ToolFailure`].
    ///
    /// Dropping the returned future (the loop abandons a call whose run was
    /// cancelled and whose grace period ran out) aborts the tool's task.
    pub async fn execute(
        &self,
        name: &str,
        input: Value,
        ctx: ToolContext,
    ) -> Result<String, ToolFailure> {
        let Some(entry) = self.tools.get(name) else {
            return Err(ToolFailure {
                kind: ToolErrorKind::Unavailable,
                message: format!("tool {name} is not available on this worker"),
            });
        };
        if let Err(message) = check_arguments(name, &entry.validator, &input) {
            return Err(ToolFailure {
                kind: ToolErrorKind::InvalidArguments,
                message,
            });
        }
        let timeout = Duration::from_millis(entry.spec.timeout_ms);
        let returns_json = entry.tool.returns_json();
        let mut task = AbortOnDrop(tokio::spawn(entry.tool.call_raw(input, ctx)));
        let joined = match tokio::time::timeout(timeout, &mut task.0).await {
            Ok(joined) => joined,
            Err(_) => {
                return Err(ToolFailure {
                    kind: ToolErrorKind::Timeout,
                    message: format!("tool {name} timed out after {} ms", timeout.as_millis()),
                });
            }
        };
        let output = match joined {
            Ok(result) => result?,
            Err(e) if e.is_panic() => {
                let payload = e.into_panic();
                let what = payload
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| payload.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".into());
                return Err(ToolFailure {
                    kind: ToolErrorKind::Panicked,
                    message: format!("tool {name} crashed: {what}"),
                });
            }
            Err(e) => {
                return Err(ToolFailure::failed(format!(
                    "tool {name} was cancelled: {e}"
                )));
            }
        };
        if returns_json && let Err(e) = serde_json::from_str::<serde::de::IgnoredAny>(&output) {
            return Err(ToolFailure {
                kind: ToolErrorKind::InvalidOutput,
                message: format!("tool {name} returned invalid JSON: {e}"),
            });
        }
        Ok(output)
    }
}
