//! The eval file: what an experiment runs and how it grades, as TOML or
//! JSON, parsed strictly (unknown keys refused, every error naming its path:
//! `graders[2].pattern: invalid regex: …`).
//!
//! ```toml
//! name = "support-refunds"
//! dataset = "support-cases@2"          # or dataset_file = "cases.jsonl"
//! agents = ["support@3", "support@4", {label = "baseline", config = {model = "m"}}]
//! repetitions = 3
//! approvals = "approve"
//! [options]
//! max_in_flight = 8
//! spend_cap = {tokens = 100000, usd_micros = 2000000}
//! completion_window_secs = 3600
//! [[graders]]
//! kind = "exact"
//! [[graders]]
//! kind = "trajectory"
//! order = "ordered_subset"
//! required = false
//! ```
//!
//! A grader's `name` defaults to its kind (`exact`), then `exact-2`,
//! `exact-3` … for further unnamed graders of that kind; names are unique.
//! A grader is `required` unless it says otherwise: a grader that is not is
//! reported but does not decide whether a cell passes.

use std::collections::BTreeMap;

use glia_proto::json_type;
use glia_proto::strict::{ParseError, from_json_str, from_json_value, from_toml_str};
use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

/// Most versions an experiment compares.
pub const MAX_VERSIONS: usize = 8;
/// Most repetitions of each case under each version.
pub const MAX_REPETITIONS: u32 = 100;
/// Most graders of an eval.
pub const MAX_GRADERS: usize = 32;
/// Longest `completion_window_secs`: 366 days.
pub const MAX_COMPLETION_WINDOW_SECS: u64 = 31_622_400;
/// Most `max_in_flight`.
pub const MAX_IN_FLIGHT: u32 = 100_000;
/// `timeout_ms` of an HTTP grader: from 100 ms to 2 minutes.
pub const HTTP_TIMEOUT_MS: std::ops::RangeInclusive<u64> = 100..=120_000;
/// `max_tokens` of a judge: 1 to 65536 tokens.
pub const JUDGE_MAX_TOKENS: std::ops::RangeInclusive<u32> = 1..=65_536;

/// An eval, as parsed and validated. Serialises to JSON that parses back to
/// the same value (every grader with its resolved name).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EvalSpec {
    /// 1 to 100 characters of `A-Z a-z 0-9 _ . -`.
    pub name: String,
    /// A stored dataset, `name` (its latest version) or `name@N` (N ≥ 1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dataset: Option<String>,
    /// Instead of `dataset`: a JSON Lines file the CLI uploads, its path
    /// relative to the eval file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dataset_file: Option<String>,
    /// The versions compared, 1 to [`MAX_VERSIONS`], labels unique; the
    /// first is the base the others are compared with.
    pub agents: Vec<VersionSpec>,
    /// Runs of each case under each version, 1 to [`MAX_REPETITIONS`].
    pub repetitions: u32,
    /// What the experiment does with a run that waits for approval.
    pub approvals: Approvals,
    /// The options of each version's batch.
    pub options: Options,
    /// How each run is graded, 1 to [`MAX_GRADERS`].
    pub graders: Vec<GraderSpec>,
}

/// One version of the agent under test.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum VersionSpec {
    /// A registered agent, `name` (its latest version when the experiment
    /// starts) or `name@N`.
    Agent(String),
    /// A run config given inline, under a label.
    Inline {
        /// The version's label in reports (1 to 100 characters of
        /// `A-Z a-z 0-9 _ . -`).
        label: String,
        /// The run config, as JSON (the server checks it as a
        /// `glia_proto::RunConfig`).
        config: Map<String, Value>,
    },
}

impl VersionSpec {
    /// The label reports use: the agent reference as written
    /// (`support@3`), or the inline version's label.
    pub fn label(&self) -> String {
        match self {
            VersionSpec::Agent(reference) => reference.clone(),
            VersionSpec::Inline { label, .. } => label.clone(),
        }
    }
}

impl<'de> Deserialize<'de> for VersionSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Inline {
            label: String,
            config: Map<String, Value>,
        }
        match Value::deserialize(d)? {
            Value::String(reference) => Ok(VersionSpec::Agent(reference)),
            inline @ Value::Object(_) => {
                let Inline { label, config } =
                    Inline::deserialize(inline).map_err(D::Error::custom)?;
                Ok(VersionSpec::Inline { label, config })
            }
            other => Err(D::Error::custom(format!(
                "must be \"name\", \"name@N\" or {{label, config}}, not {}",
                json_type(&other)
            ))),
        }
    }
}

/// What the experiment does when a run waits for approval.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Approvals {
    /// Approve every new call; reject running again a call a crash
    /// interrupted (its outcome is unknown: fail closed).
    Approve,
    /// Approve every call, also running again a call a crash interrupted:
    /// only for tools safe to run twice (recorded ones, a replay eval).
    ApproveAll,
    /// Reject every call.
    Reject,
    /// Leave it parked until the batch's completion window ends.
    #[default]
    Leave,
}

/// The batch options of each version's batch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Options {
    /// Most runs of the batch not done at once, 1 to [`MAX_IN_FLIGHT`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_in_flight: Option<u32>,
    /// Spend cap of each version's batch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spend_cap: Option<BatchSpendCap>,
    /// Seconds after submission after which runs not yet started expire, 1
    /// to [`MAX_COMPLETION_WINDOW_SECS`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completion_window_secs: Option<u64>,
}

/// A batch's spend cap; a field left out is uncapped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchSpendCap {
    /// Most tokens (every kind).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
    /// Most USD micros.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usd_micros: Option<u64>,
}

/// One grader: its name, whether it decides the cell, and what it checks.
/// Written flat: `{name = "refund", kind = "exact", on = "output"}`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GraderSpec {
    /// Unique in the eval; the kind when not given (`exact`, `exact-2`, …).
    pub name: String,
    /// Whether a failed verdict fails the cell (default true).
    pub required: bool,
    /// What it checks.
    #[serde(flatten)]
    pub kind: GraderKind,
}

/// Where a grader looks: the run's answer text or its structured output.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Target {
    /// The final answer text.
    #[default]
    Answer,
    /// The structured output (JSON).
    Output,
}

/// `exact`: the answer (or the output) equals a value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExactGrader {
    /// What is compared.
    #[serde(default)]
    pub on: Target,
    /// The value, given here: a string for the answer, any JSON for the
    /// output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<Value>,
    /// Or the key of the case's `expected` that holds it (`answer` when
    /// neither is given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected: Option<String>,
    /// Answer only: compare letter case too (default true).
    #[serde(default = "yes")]
    pub case_sensitive: bool,
    /// Answer only: ignore leading and trailing whitespace (default true).
    #[serde(default = "yes")]
    pub trim: bool,
}

/// `contains`: the answer contains a string, or each of several; the score
/// is the fraction contained.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContainsGrader {
    /// A string or an array of strings, given here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<Value>,
    /// Or the key of the case's `expected` that holds it (`answer` when
    /// neither is given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected: Option<String>,
    /// Compare letter case too (default false).
    #[serde(default)]
    pub case_sensitive: bool,
}

/// `regex`: the answer matches a pattern (Rust `regex` syntax, unanchored).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegexGrader {
    /// The pattern, given here (compiled when the eval is parsed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pattern: Option<String>,
    /// Or the key of the case's `expected` that holds it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected: Option<String>,
}

/// `json_schema`: the structured output is valid against a JSON Schema (no
/// output fails).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JsonSchemaGrader {
    /// The schema (draft from its `$schema`, default 2020-12; references
    /// resolve within it only).
    pub schema: Value,
}

/// `fields`: named fields of the structured output equal the case's
/// expected values; the score is the fraction equal.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FieldsGrader {
    /// The key of the case's `expected` holding an object whose keys are
    /// JSON Pointers (`/refund/amount`) or top-level keys (default
    /// `output`).
    #[serde(default = "output_key")]
    pub expected: String,
}

/// `trajectory`: the run's tool calls against the case's expected calls.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrajectoryGrader {
    /// The key of the case's `expected` holding an array of
    /// `{"name": …, "input": {…}}` (`input` optional: any input matches);
    /// default `tools`.
    #[serde(default = "tools_key")]
    pub expected: String,
    /// How the sequences must line up.
    #[serde(default)]
    pub order: Order,
    /// How a call's input must match.
    #[serde(default)]
    pub args: ArgsMatch,
}

/// How a run's tool calls must line up with the expected calls.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Order {
    /// The same calls in the same order, no more.
    #[default]
    Exact,
    /// Each expected call made somewhere (as many times as expected);
    /// others allowed.
    Subset,
    /// The expected calls made in order; others may come between.
    OrderedSubset,
}

/// How an expected call's input must match the call made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ArgsMatch {
    /// Equal JSON.
    #[default]
    Exact,
    /// Every key of the expected input present with an equal value
    /// (objects compared the same way, recursively); more keys allowed.
    Subset,
    /// Names only.
    Ignore,
}

/// `bounds`: the run stayed within limits; the score is the fraction of
/// limits kept. At least one is given.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BoundsGrader {
    /// Most cost, USD micros.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cost_usd_micros: Option<u64>,
    /// Most tokens (every kind).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    /// Most model calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_turns: Option<u64>,
    /// Most tool calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tool_calls: Option<u64>,
    /// Most ms from the run's first event to its last.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_latency_ms: Option<u64>,
}

/// `judge`: an LLM grades the run against a rubric (a run of its own).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JudgeGrader {
    /// The provider in the operator's catalogue (default: the worker's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// The judge's model.
    pub model: String,
    /// What a good answer is.
    pub rubric: String,
    /// The least score that passes, 0 to 1 (default 0.5); the judge must
    /// also say pass.
    #[serde(default = "half")]
    pub pass_threshold: f64,
    /// The judge's output token cap per model call (default 1024).
    #[serde(default = "judge_max_tokens")]
    pub max_tokens: u32,
}

/// `http`: a service of the tenant's grades the run (a JSON POST).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpGrader {
    /// `http://…` or `https://…`.
    pub url: String,
    /// How long the caller waits for the answer, ms (default 10000).
    #[serde(default = "http_timeout_ms")]
    pub timeout_ms: u64,
}

fn yes() -> bool {
    true
}
fn half() -> f64 {
    0.5
}
fn judge_max_tokens() -> u32 {
    1024
}
fn http_timeout_ms() -> u64 {
    10_000
}
fn output_key() -> String {
    "output".into()
}
fn tools_key() -> String {
    "tools".into()
}

macro_rules! grader_kinds {
    ($($(#[$doc:meta])* $variant:ident($ty:ty) = $tag:literal,)*) => {
        /// What a grader checks; the `kind` tag names it.
        #[derive(Debug, Clone, PartialEq, Serialize)]
        #[serde(tag = "kind")]
        pub enum GraderKind {
            $($(#[$doc])* #[serde(rename = $tag)] $variant($ty),)*
        }

        impl GraderKind {
            /// Every kind's tag.
            pub const KINDS: &[&str] = &[$($tag),*];

            /// This kind's tag (`exact`, `json_schema`, …).
            pub fn kind(&self) -> &'static str {
                match self {
                    $(GraderKind::$variant(_) => $tag,)*
                }
            }

            /// The grader of kind `tag` from the rest of its table, strictly;
            /// `None` for an unknown kind.
            fn parse(tag: &str, rest: Value) -> Option<Result<GraderKind, ParseError>> {
                match tag {
                    $($tag => Some(from_json_value(rest).map(GraderKind::$variant)),)*
                    _ => None,
                }
            }
        }
    };
}

grader_kinds! {
    /// See [`ExactGrader`].
    Exact(ExactGrader) = "exact",
    /// See [`ContainsGrader`].
    Contains(ContainsGrader) = "contains",
    /// See [`RegexGrader`].
    Regex(RegexGrader) = "regex",
    /// See [`JsonSchemaGrader`].
    JsonSchema(JsonSchemaGrader) = "json_schema",
    /// See [`FieldsGrader`].
    Fields(FieldsGrader) = "fields",
    /// See [`TrajectoryGrader`].
    Trajectory(TrajectoryGrader) = "trajectory",
    /// See [`BoundsGrader`].
    Bounds(BoundsGrader) = "bounds",
    /// See [`JudgeGrader`].
    Judge(JudgeGrader) = "judge",
    /// See [`HttpGrader`].
    Http(HttpGrader) = "http",
}

/// An eval file that does not parse or is not valid: the path of the field
/// (`graders[2].pattern`; empty for the document) and why. Displays as
/// `path: reason`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", if path.is_empty() { reason.clone() } else { format!("{path}: {reason}") })]
pub struct SpecError {
    /// Path of the field from the document's root.
    pub path: String,
    /// What is wrong with it.
    pub reason: String,
}

impl From<ParseError> for SpecError {
    fn from(e: ParseError) -> SpecError {
        SpecError {
            path: e.path,
            reason: e.reason,
        }
    }
}

fn spec_error(path: impl Into<String>, reason: impl Into<String>) -> SpecError {
    SpecError {
        path: path.into(),
        reason: reason.into(),
    }
}

/// Parse and validate an eval file written in TOML.
pub fn parse_toml(text: &str) -> Result<EvalSpec, SpecError> {
    EvalSpec::from_value(from_toml_str(text)?)
}

/// Parse and validate an eval file written in JSON (also the stored form).
pub fn parse_json(text: &str) -> Result<EvalSpec, SpecError> {
    EvalSpec::from_value(from_json_str(text)?)
}

/// The document's fields as written, graders still tables.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Document {
    name: String,
    dataset: Option<String>,
    dataset_file: Option<String>,
    agents: Vec<VersionSpec>,
    #[serde(default = "one")]
    repetitions: u32,
    #[serde(default)]
    approvals: Approvals,
    #[serde(default)]
    options: Options,
    #[serde(default)]
    graders: Vec<Map<String, Value>>,
}

fn one() -> u32 {
    1
}

impl EvalSpec {
    /// Parse and validate an eval given as a JSON value (what both
    /// [`parse_toml`] and [`parse_json`] read).
    pub fn from_value(value: Value) -> Result<EvalSpec, SpecError> {
        let doc: Document = from_json_value(value)?;
        let mut graders = Vec::with_capacity(doc.graders.len());
        let mut unnamed: BTreeMap<&'static str, usize> = BTreeMap::new();
        for (i, table) in doc.graders.into_iter().enumerate() {
            let (name, required, kind) =
                parse_grader(table).map_err(|e| e.under(&format!("graders[{i}]")))?;
            let name = name.unwrap_or_else(|| {
                let n = unnamed.entry(kind.kind()).or_default();
                *n += 1;
                match *n {
                    1 => kind.kind().to_owned(),
                    n => format!("{}-{n}", kind.kind()),
                }
            });
            graders.push(GraderSpec {
                name,
                required,
                kind,
            });
        }
        let spec = EvalSpec {
            name: doc.name,
            dataset: doc.dataset,
            dataset_file: doc.dataset_file,
            agents: doc.agents,
            repetitions: doc.repetitions,
            approvals: doc.approvals,
            options: doc.options,
            graders,
        };
        spec.validate()?;
        Ok(spec)
    }

    /// Check everything that needs no server: names, references, ranges,
    /// unique labels and grader names, and every grader (literal regexes and
    /// schemas compile). Errors name the field's path.
    pub fn validate(&self) -> Result<(), SpecError> {
        if !is_valid_name(&self.name) {
            return Err(spec_error("name", format!("{:?} {NAME_RULE}", self.name)));
        }
        match (&self.dataset, &self.dataset_file) {
            (Some(_), Some(_)) => {
                return Err(spec_error(
                    "dataset_file",
                    "give dataset or dataset_file, not both",
                ));
            }
            (None, None) => {
                return Err(spec_error(
                    "dataset",
                    "missing (give dataset, a stored dataset's name or name@N, or dataset_file)",
                ));
            }
            (Some(dataset), None) => {
                if !parse_ref(dataset).is_some_and(|(name, _)| is_valid_name(&name)) {
                    return Err(spec_error(
                        "dataset",
                        format!("{dataset:?} is not name or name@N"),
                    ));
                }
            }
            (None, Some(file)) => {
                if file.trim().is_empty() || file.chars().any(char::is_control) {
                    return Err(spec_error("dataset_file", "must be a file path"));
                }
            }
        }
        if self.agents.is_empty() || self.agents.len() > MAX_VERSIONS {
            return Err(spec_error(
                "agents",
                format!("must hold 1 to {MAX_VERSIONS} versions"),
            ));
        }
        let mut labels = Vec::with_capacity(self.agents.len());
        for (i, version) in self.agents.iter().enumerate() {
            match version {
                VersionSpec::Agent(reference) => {
                    if !parse_ref(reference).is_some_and(|(name, _)| is_agent_name(&name)) {
                        let reason = format!("{reference:?} is not name or name@N");
                        return Err(spec_error(format!("agents[{i}]"), reason));
                    }
                }
                VersionSpec::Inline { label, .. } => {
                    if !is_valid_name(label) {
                        let reason = format!("{label:?} {NAME_RULE}");
                        return Err(spec_error(format!("agents[{i}].label"), reason));
                    }
                }
            }
            let label = version.label();
            if labels.contains(&label) {
                return Err(spec_error("agents", format!("{label:?} appears twice")));
            }
            labels.push(label);
        }
        if !(1..=MAX_REPETITIONS).contains(&self.repetitions) {
            return Err(spec_error(
                "repetitions",
                format!("must be 1 to {MAX_REPETITIONS}"),
            ));
        }
        if let Some(n) = self.options.max_in_flight
            && !(1..=MAX_IN_FLIGHT).contains(&n)
        {
            let reason = format!("must be 1 to {MAX_IN_FLIGHT}");
            return Err(spec_error("options.max_in_flight", reason));
        }
        if let Some(secs) = self.options.completion_window_secs
            && !(1..=MAX_COMPLETION_WINDOW_SECS).contains(&secs)
        {
            let reason = format!("must be 1 to {MAX_COMPLETION_WINDOW_SECS}");
            return Err(spec_error("options.completion_window_secs", reason));
        }
        if self.graders.is_empty() || self.graders.len() > MAX_GRADERS {
            return Err(spec_error(
                "graders",
                format!("must hold 1 to {MAX_GRADERS} graders"),
            ));
        }
        for (i, grader) in self.graders.iter().enumerate() {
            let at = |field: &str| match field {
                "" => format!("graders[{i}]"),
                field => format!("graders[{i}].{field}"),
            };
            if !is_valid_name(&grader.name) {
                return Err(spec_error(
                    at("name"),
                    format!("{:?} {NAME_RULE}", grader.name),
                ));
            }
            if let Some(first) = self.graders[..i].iter().position(|g| g.name == grader.name) {
                let reason = format!("{:?} is used by graders[{first}]", grader.name);
                return Err(spec_error(at("name"), reason));
            }
            grader
                .kind
                .validate()
                .map_err(|(field, reason)| spec_error(at(field), reason))?;
        }
        Ok(())
    }

    /// The stored dataset this eval runs: its name and version (`None`: the
    /// latest). `None` when the eval names a file instead.
    pub fn dataset_ref(&self) -> Option<(String, Option<u32>)> {
        self.dataset.as_deref().and_then(parse_ref)
    }

    /// The versions' labels, in order.
    pub fn labels(&self) -> Vec<String> {
        self.agents.iter().map(VersionSpec::label).collect()
    }
}

impl<'de> Deserialize<'de> for EvalSpec {
    /// Through [`EvalSpec::from_value`]: a stored spec is validated again.
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        EvalSpec::from_value(Value::deserialize(d)?).map_err(D::Error::custom)
    }
}

/// A grader's table: `(name, required, kind)`; errors' paths within it.
fn parse_grader(
    mut table: Map<String, Value>,
) -> Result<(Option<String>, bool, GraderKind), ParseError> {
    let err = |path: &str, reason: String| ParseError {
        path: path.into(),
        reason,
    };
    let kinds = GraderKind::KINDS.join(", ");
    let tag = match table.remove("kind") {
        None => return Err(err("kind", format!("missing (one of {kinds})"))),
        Some(Value::String(tag)) => tag,
        Some(other) => {
            return Err(err(
                "kind",
                format!("must be a string, not {}", json_type(&other)),
            ));
        }
    };
    let name = match table.remove("name") {
        None => None,
        Some(Value::String(name)) => Some(name),
        Some(other) => {
            return Err(err(
                "name",
                format!("must be a string, not {}", json_type(&other)),
            ));
        }
    };
    let required = match table.remove("required") {
        None => true,
        Some(Value::Bool(required)) => required,
        Some(other) => {
            return Err(err(
                "required",
                format!("must be a boolean, not {}", json_type(&other)),
            ));
        }
    };
    match GraderKind::parse(&tag, Value::Object(table)) {
        None => Err(err(
            "kind",
            format!("{tag:?} is not a grader kind (one of {kinds})"),
        )),
        Some(kind) => Ok((name, required, kind?)),
    }
}

/// What a valid name is made of (eval names, dataset names, labels, grader
/// names).
const NAME_RULE: &str = "must be 1 to 100 characters of A-Z a-z 0-9 _ . -";

/// True for a valid eval, dataset, label or grader name: 1 to 100
/// characters of `A-Z a-z 0-9 _ . -`.
pub fn is_valid_name(name: &str) -> bool {
    (1..=100).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// An agent's name, as the registry has it: `^[a-z0-9][a-z0-9_-]{0,63}$`.
fn is_agent_name(name: &str) -> bool {
    let lower_or_digit = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    name.len() <= 64
        && name.bytes().next().is_some_and(lower_or_digit)
        && name
            .bytes()
            .all(|b| lower_or_digit(b) || matches!(b, b'_' | b'-'))
}

/// Split a reference `name` or `name@N` (N a version, 1 or more, written
/// without sign or leading zeros). `None` when it is neither; the name's
/// characters are not checked.
pub fn parse_ref(reference: &str) -> Option<(String, Option<u32>)> {
    match reference.split_once('@') {
        None if !reference.is_empty() => Some((reference.to_owned(), None)),
        Some((name, n))
            if !name.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) && !n.starts_with('0') =>
        {
            Some((name.to_owned(), Some(n.parse().ok()?)))
        }
        _ => None,
    }
}

/// The strings a `contains` grader looks for: a string, or a non-empty
/// array of strings.
pub(crate) fn needles(value: &Value) -> Result<Vec<&str>, String> {
    let wrong = || {
        format!(
            "must be a string or a non-empty array of strings, not {}",
            json_type(value)
        )
    };
    match value {
        Value::String(s) => Ok(vec![s.as_str()]),
        Value::Array(items) if !items.is_empty() => {
            items.iter().map(|v| v.as_str().ok_or_else(wrong)).collect()
        }
        _ => Err(wrong()),
    }
}

/// Compile a grader's regex (bounded like every tenant regex).
pub(crate) fn compile_pattern(pattern: &str) -> Result<regex::Regex, String> {
    glia_proto::limits::compile_regex(pattern, 1).map_err(|e| format!("invalid regex: {e}"))
}

/// Compile a grader's JSON Schema (bounded like every tenant schema; no
/// reference leaves the schema).
pub(crate) fn compile_schema(schema: &Value) -> Result<jsonschema::Validator, String> {
    glia_proto::limits::check_schema("schema", schema).map_err(|e| e.to_string())?;
    jsonschema::validator_for(schema).map_err(|e| format!("not a valid JSON Schema: {e}"))
}

impl GraderKind {
    /// Check the grader alone: `(field, reason)`, the field relative to the
    /// grader's table (empty for the table itself).
    fn validate(&self) -> Result<(), (&'static str, String)> {
        let key_ok = |key: &Option<String>| match key {
            Some(k) if k.trim().is_empty() => Err(("expected", "must not be blank".to_owned())),
            _ => Ok(()),
        };
        let not_both = |value: bool, key: &Option<String>| match value && key.is_some() {
            true => Err(("expected", "give value or expected, not both".to_owned())),
            false => Ok(()),
        };
        match self {
            GraderKind::Exact(g) => {
                not_both(g.value.is_some(), &g.expected)?;
                key_ok(&g.expected)?;
                if g.on == Target::Answer
                    && let Some(v) = &g.value
                    && !v.is_string()
                {
                    let reason = format!("must be a string on the answer, not {}", json_type(v));
                    return Err(("value", reason));
                }
            }
            GraderKind::Contains(g) => {
                not_both(g.value.is_some(), &g.expected)?;
                key_ok(&g.expected)?;
                if let Some(v) = &g.value {
                    needles(v).map_err(|reason| ("value", reason))?;
                }
            }
            GraderKind::Regex(g) => {
                key_ok(&g.expected)?;
                match (&g.pattern, &g.expected) {
                    (Some(_), Some(_)) => {
                        return Err(("expected", "give pattern or expected, not both".into()));
                    }
                    (None, None) => return Err(("pattern", "missing (or give expected)".into())),
                    (Some(p), None) => {
                        compile_pattern(p).map_err(|reason| ("pattern", reason))?;
                    }
                    (None, Some(_)) => {}
                }
            }
            GraderKind::JsonSchema(g) => {
                compile_schema(&g.schema).map_err(|reason| ("schema", reason))?;
            }
            GraderKind::Fields(g) => key_ok(&Some(g.expected.clone()))?,
            GraderKind::Trajectory(g) => key_ok(&Some(g.expected.clone()))?,
            GraderKind::Bounds(g) => {
                if *g == BoundsGrader::default() {
                    let reason = "give at least one of max_cost_usd_micros, max_tokens, \
                                  max_turns, max_tool_calls, max_latency_ms";
                    return Err(("", reason.into()));
                }
            }
            GraderKind::Judge(g) => {
                if g.provider.as_ref().is_some_and(|p| p.trim().is_empty()) {
                    return Err(("provider", "must not be blank".into()));
                }
                if g.model.trim().is_empty() {
                    return Err(("model", "must not be blank".into()));
                }
                if g.rubric.trim().is_empty() {
                    return Err(("rubric", "must not be blank".into()));
                }
                if !(0.0..=1.0).contains(&g.pass_threshold) {
                    return Err(("pass_threshold", "must be 0 to 1".into()));
                }
                if !JUDGE_MAX_TOKENS.contains(&g.max_tokens) {
                    let (lo, hi) = JUDGE_MAX_TOKENS.into_inner();
                    return Err(("max_tokens", format!("must be {lo} to {hi}")));
                }
            }
            GraderKind::Http(g) => {
                let rest = g
                    .url
                    .strip_prefix("http://")
                    .or_else(|| g.url.strip_prefix("https://"));
                let host_ok = rest.is_some_and(|r| !r.is_empty() && !r.starts_with('/'));
                if !host_ok || g.url.chars().any(|c| c.is_whitespace() || c.is_control()) {
                    let reason = format!("{:?} is not an http:// or https:// URL", g.url);
                    return Err(("url", reason));
                }
                if !HTTP_TIMEOUT_MS.contains(&g.timeout_ms) {
                    let (lo, hi) = HTTP_TIMEOUT_MS.into_inner();
                    return Err(("timeout_ms", format!("must be {lo} to {hi}")));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const EXAMPLE: &str = r#"
name = "support-refunds"
dataset = "support-cases@2"
agents = ["support@3", "support", {label = "baseline", config = {model = "m", budget = {max_turns = 4}}}]
repetitions = 3
approvals = "approve"

[options]
max_in_flight = 8
spend_cap = {tokens = 100000, usd_micros = 2000000}
completion_window_secs = 3600

[[graders]]
kind = "exact"

[[graders]]
kind = "exact"
on = "output"
value = {refund = true}
required = false

[[graders]]
name = "policy"
kind = "regex"
pattern = "(?i)refund(ed)?"

[[graders]]
kind = "trajectory"
order = "ordered_subset"
args = "subset"

[[graders]]
kind = "json_schema"
schema = {type = "object", required = ["refund"]}

[[graders]]
kind = "bounds"
max_cost_usd_micros = 5000
max_latency_ms = 60000

[[graders]]
kind = "judge"
provider = "anthropic"
model = "claude"
rubric = "Polite and correct."

[[graders]]
kind = "http"
url = "https://grader.example/grade"
"#;

    fn toml_error(text: &str) -> String {
        parse_toml(text).unwrap_err().to_string()
    }

    /// The example with `from` replaced by `to` (which must occur).
    fn edited(from: &str, to: &str) -> String {
        assert!(EXAMPLE.contains(from), "{from}");
        EXAMPLE.replacen(from, to, 1)
    }

    #[test]
    fn the_example_parses_with_defaults_and_round_trips() {
        let spec = parse_toml(EXAMPLE).unwrap();
        assert_eq!(spec.labels(), ["support@3", "support", "baseline"]);
        assert_eq!(spec.dataset_ref(), Some(("support-cases".into(), Some(2))));
        assert_eq!((spec.repetitions, spec.approvals), (3, Approvals::Approve));
        assert_eq!(spec.options.spend_cap.unwrap().usd_micros, Some(2_000_000));
        let names: Vec<&str> = spec.graders.iter().map(|g| g.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "exact",
                "exact-2",
                "policy",
                "trajectory",
                "json_schema",
                "bounds",
                "judge",
                "http"
            ]
        );
        assert!(spec.graders[0].required && !spec.graders[1].required);
        let GraderKind::Judge(judge) = &spec.graders[6].kind else {
            panic!()
        };
        assert_eq!((judge.pass_threshold, judge.max_tokens), (0.5, 1024));
        let GraderKind::Http(http) = &spec.graders[7].kind else {
            panic!()
        };
        assert_eq!(http.timeout_ms, 10_000);
        let stored = serde_json::to_string(&spec).unwrap();
        assert_eq!(parse_json(&stored).unwrap(), spec);
        assert_eq!(serde_json::from_str::<EvalSpec>(&stored).unwrap(), spec);
        let value = serde_json::to_value(&spec).unwrap();
        assert_eq!(
            value["graders"][1],
            json!({"name": "exact-2", "required": false, "kind": "exact", "on": "output", "value": {"refund": true}, "case_sensitive": true, "trim": true})
        );
        assert_eq!(value["agents"][2]["label"], "baseline");

        let minimal = parse_json(r#"{"name": "e", "dataset_file": "cases.jsonl", "agents": ["a"], "graders": [{"kind": "contains", "value": ["x", "y"]}]}"#).unwrap();
        assert_eq!(
            (minimal.repetitions, minimal.approvals),
            (1, Approvals::Leave)
        );
        assert_eq!(minimal.options, Options::default());
        assert_eq!(minimal.dataset_ref(), None);
    }

    #[test]
    fn errors_name_the_path() {
        let cases = [
            (
                edited("(?i)refund(ed)?", "(unclosed"),
                "graders[2].pattern: invalid regex: ",
            ),
            (
                edited("repetitions = 3", "repetitions = 0"),
                "repetitions: must be 1 to 100",
            ),
            (
                edited("repetitions = 3", "repetitions = 101"),
                "repetitions: must be 1 to 100",
            ),
            (
                edited(r#""support", {"#, r#""x@0", {"#),
                r#"agents[1]: "x@0" is not name or name@N"#,
            ),
            (
                edited(r#""support", {"#, r#""Support", {"#),
                r#"agents[1]: "Support" is not name or name@N"#,
            ),
            (
                edited(r#""support", {"#, r#""support@3", {"#),
                r#"agents: "support@3" appears twice"#,
            ),
            (
                edited(r#"label = "baseline""#, r#"label = "support""#),
                r#"agents: "support" appears twice"#,
            ),
            (
                edited(r#"label = "baseline""#, r#"label = "a b""#),
                "agents[2].label: \"a b\" must be 1 to 100",
            ),
            (
                edited("label = ", "lable = "),
                "agents[2].lable: unknown field",
            ),
            (
                edited(r#"name = "policy""#, r#"name = "exact""#),
                r#"graders[2].name: "exact" is used by graders[0]"#,
            ),
            (
                edited(
                    "kind = \"json_schema\"",
                    "name = \"exact-2\"\nkind = \"json_schema\"",
                ),
                r#"graders[4].name: "exact-2" is used by graders[1]"#,
            ),
            (
                edited("approvals = \"approve\"", "approval = \"approve\""),
                "approval: unknown field",
            ),
            (
                edited("order = ", "ordr = "),
                "graders[3].ordr: unknown field",
            ),
            (
                edited("order = \"ordered_subset\"", "order = \"any\""),
                "graders[3].order: unknown variant `any`",
            ),
            (
                edited(
                    "url = \"https://grader.example/grade\"",
                    "url = \"https://g/x\"\ntimeout_ms = \"9\"",
                ),
                "graders[7].timeout_ms: invalid type: string \"9\"",
            ),
            (
                edited(
                    "url = \"https://grader.example/grade\"",
                    "url = \"ftp://x\"",
                ),
                "graders[7].url: \"ftp://x\" is not an http:// or https:// URL",
            ),
            (
                edited(
                    "url = \"https://grader.example/grade\"",
                    "url = \"https://x\"\ntimeout_ms = 50",
                ),
                "graders[7].timeout_ms: must be 100 to 120000",
            ),
            (
                edited("kind = \"http\"", "kind = \"smtp\""),
                "graders[7].kind: \"smtp\" is not a grader kind (one of exact, contains",
            ),
            (
                edited("kind = \"http\"", "required = \"yes\"\nkind = \"http\""),
                "graders[7].required: must be a boolean, not string",
            ),
            (
                edited("rubric = ", "pass_threshold = 1.5\nrubric = "),
                "graders[6].pass_threshold: must be 0 to 1",
            ),
            (
                edited("model = \"claude\"", "model = \" \""),
                "graders[6].model: must not be blank",
            ),
            (
                edited("max_cost_usd_micros = 5000\nmax_latency_ms = 60000", ""),
                "graders[5]: give at least one of",
            ),
            (
                edited("type = \"object\"", "type = \"thing\""),
                "graders[4].schema: not a valid JSON Schema",
            ),
            (
                edited("on = \"output\"", "on = \"answer\""),
                "graders[1].value: must be a string on the answer, not object",
            ),
            (
                edited(
                    "pattern = \"(?i)refund(ed)?\"",
                    "pattern = \"x\"\nexpected = \"p\"",
                ),
                "graders[2].expected: give pattern or expected, not both",
            ),
            (
                edited("dataset = \"support-cases@2\"", "dataset = \"cases@01\""),
                r#"dataset: "cases@01" is not name or name@N"#,
            ),
            (
                edited(
                    "dataset = \"support-cases@2\"",
                    "dataset = \"c\"\ndataset_file = \"f\"",
                ),
                "dataset_file: give dataset or dataset_file, not both",
            ),
            (
                edited("dataset = \"support-cases@2\"", ""),
                "dataset: missing",
            ),
            (
                edited("max_in_flight = 8", "max_in_flight = 0"),
                "options.max_in_flight: must be 1 to 100000",
            ),
            (
                edited(
                    "completion_window_secs = 3600",
                    "completion_window_secs = 31622401",
                ),
                "options.completion_window_secs: must be 1 to 31622400",
            ),
            (
                edited("usd_micros = 2000000", "usd = 2"),
                "options.spend_cap.usd: unknown field",
            ),
            (
                edited("name = \"support-refunds\"", "name = \"support refunds\""),
                "name: \"support refunds\" must be 1 to 100",
            ),
        ];
        for (text, want) in cases {
            let got = toml_error(&text);
            assert!(got.starts_with(want), "got {got:?}, want {want:?}");
        }
        let no_graders = EXAMPLE.split("[[graders]]").next().unwrap();
        assert_eq!(toml_error(no_graders), "graders: must hold 1 to 32 graders");
        let e = parse_json(
            r#"{"name": "e", "dataset": "d", "agents": [], "graders": [{"kind": "exact"}]}"#,
        )
        .unwrap_err();
        assert_eq!(e.to_string(), "agents: must hold 1 to 8 versions");
        let e = parse_json(
            r#"{"name": "e", "dataset": "d", "agents": ["a"], "graders": [{"value": "x"}]}"#,
        )
        .unwrap_err();
        assert_eq!(
            (e.path.as_str(), e.reason.starts_with("missing")),
            ("graders[0].kind", true)
        );
        let e = parse_json(
            r#"{"name": "e", "dataset": "d", "agents": [3], "graders": [{"kind": "exact"}]}"#,
        )
        .unwrap_err();
        assert_eq!(e.path, "agents[0]");
        assert!(
            parse_toml("name = ")
                .unwrap_err()
                .reason
                .starts_with("not valid TOML")
        );
    }

    #[test]
    fn references() {
        assert_eq!(parse_ref("a"), Some(("a".into(), None)));
        assert_eq!(parse_ref("a@12"), Some(("a".into(), Some(12))));
        for bad in [
            "",
            "@1",
            "a@",
            "a@0",
            "a@01",
            "a@+1",
            "a@1@2",
            "a@99999999999",
        ] {
            assert_eq!(parse_ref(bad), None, "{bad}");
        }
        assert!(
            is_agent_name("support-2") && !is_agent_name("-x") && !is_agent_name(&"a".repeat(65))
        );
        assert!(is_valid_name("Support.v2_x-1") && !is_valid_name("") && !is_valid_name("a/b"));
    }
}
