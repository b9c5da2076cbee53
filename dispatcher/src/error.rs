//! Every error the API answers, as one enum with a stable snake_case code.
//!
//! On the wire every error is
//! `{"error": {"code": "stable_snake_case", "message": "human text"}}` with the
//! HTTP status of [`ApiError::status`]. Codes never change meaning; messages
//! may. Bad input is always a 4xx: a 5xx means a backing store failed
//! (`*_unavailable`, 503), a stored record does not decode
//! (`corrupt_record`, 500: retrying does not help) or a bug (`internal`, 500).

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use glia_backends::{LedgerError, LogError, QueueError};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// The JSON body of every error: `{"error": {"code": …, "message": …}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorDetail,
}

/// Code and message of an [`ErrorBody`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ErrorDetail {
    /// Stable snake_case code, e.g. `run_not_found` (see [`ApiError::code`]).
    pub code: String,
    /// Human-readable explanation; not stable.
    pub message: String,
    /// For an error in one line of a JSON Lines upload: its number, from 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line: Option<u64>,
    /// For a value that is not acceptable (422 `invalid_request`): the
    /// field, as a path from the body's root, e.g.
    /// `config.external_tools[1].input_schema`; for a query parameter that
    /// is (400 `invalid_query`, where named): the parameter, e.g. `cursor`.
    /// Absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
}

/// Why a request failed. Each variant's message is its `#[error]`; its HTTP
/// status and stable code ([`ApiError::status`], [`ApiError::code`]) are its
/// arm of `status_and_code`, the one table of them.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ApiError {
    /// 401 `missing_token`: no `Authorization: Bearer …` header.
    #[error("missing bearer token: send `Authorization: Bearer <token>`")]
    MissingToken,
    /// 401 `invalid_token`: the token is not configured.
    #[error("invalid bearer token")]
    InvalidToken,
    /// 403 `forbidden`: the token lacks a scope the endpoint needs.
    #[error("this token lacks the `{0}` scope")]
    Forbidden(String),
    /// 404 `route_not_found`: no such endpoint.
    #[error("no route {0}")]
    RouteNotFound(String),
    /// 404 `not_available`: a feature this dispatcher does not have (webhooks
    /// without the Postgres event log); the message says which.
    #[error("{0}")]
    NotAvailable(String),
    /// 405 `method_not_allowed`.
    #[error("method not allowed on this route")]
    MethodNotAllowed,
    /// 404 `agent_not_found`: the tenant has no such agent (or version).
    #[error("agent {0} not found")]
    AgentNotFound(String),
    /// 404 `batch_not_found`: no such batch, or it belongs to another tenant.
    #[error("batch {0} not found")]
    BatchNotFound(Uuid),
    /// 404 `webhook_not_found`: no such webhook subscription, or it belongs to another tenant.
    #[error("webhook {0} not found")]
    WebhookNotFound(Uuid),
    /// 404 `schedule_not_found`: no such schedule, or it belongs to another tenant.
    #[error("schedule {0} not found")]
    ScheduleNotFound(Uuid),
    /// 409 `schedule_exists`: the tenant has another schedule of this name.
    #[error("the tenant already has a schedule named {0:?}")]
    ScheduleExists(String),
    /// 404 `dataset_not_found`: the tenant has no such dataset (or version).
    #[error("dataset {0} not found")]
    DatasetNotFound(String),
    /// 404 `experiment_not_found`: no such experiment, or it belongs to another tenant.
    #[error("experiment {0} not found")]
    ExperimentNotFound(Uuid),
    /// 409 `experiment_ended`: the experiment completed or was cancelled.
    #[error("experiment {0} has ended")]
    ExperimentEnded(Uuid),
    /// One line of a JSON Lines upload is bad: 400 `malformed_json` (not
    /// JSON), 422 `invalid_body` (wrong shape) or 422 `invalid_request` (a
    /// value refused); `line` and `field` say where.
    #[error("line {line}{}: {reason}", field.as_deref().map(|f| format!(", {f}")).unwrap_or_default())]
    InvalidLine {
        /// Line number, from 1.
        line: u64,
        /// The field within the line, when one is to blame.
        field: Option<String>,
        /// `malformed_json`, `invalid_body` or `invalid_request`.
        code: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// 404 `run_not_found`: no such run, or it belongs to another tenant.
    #[error("run {0} not found")]
    RunNotFound(Uuid),
    /// 404 `call_not_found`: the run has no such tool call among its pending calls.
    #[error("run {run_id} has no pending tool call {call_id}")]
    CallNotFound {
        /// The run.
        run_id: Uuid,
        /// The call.
        call_id: String,
    },
    /// 404 `approval_not_found`: the call exists but no approval was requested for it.
    #[error("tool call {call_id} of run {run_id} does not wait for an approval")]
    ApprovalNotFound {
        /// The run.
        run_id: Uuid,
        /// The call.
        call_id: String,
    },
    /// 409 `already_decided`: a decision for this call was already posted;
    /// the message names the decision that won (who, what, when).
    #[error("tool call {call_id} of run {run_id} was already decided{}", winner.as_deref().map(|w| format!(": {w}")).unwrap_or_default())]
    AlreadyDecided {
        /// The run.
        run_id: Uuid,
        /// The call.
        call_id: String,
        /// The winning decision in words (`approve by ana at 2025-…`), when
        /// the log or the inbox still says.
        winner: Option<String>,
    },
    /// 409 `stale_args`: the decision quotes an `args_hash` other than the pending one.
    #[error(
        "the decision was made on other arguments (hash {got}); the pending arguments hash to {expected}"
    )]
    StaleArgs {
        /// Hash of the pending arguments.
        expected: String,
        /// Hash the decision quoted.
        got: String,
    },
    /// 409 `not_external`: a result was posted for a call a worker runs itself.
    #[error("tool call {0} is not an external tool call")]
    NotExternal(String),
    /// 409 `already_answered`: the external call already has a result (posted or recorded).
    #[error("tool call {0} already has a result")]
    AlreadyAnswered(String),
    /// 409 `not_awaiting_input`: a message was posted to a run not parked at `awaiting_input`.
    #[error("run {0} is not waiting for a user message")]
    NotAwaitingInput(Uuid),
    /// 409 `not_paused`: resume was posted to a run neither parked at
    /// `paused` nor pausing.
    #[error("run {0} is not paused")]
    NotPaused(Uuid),
    /// 409 `already_paused`: pause was posted to a run paused by an
    /// operator or with a pause already requested.
    #[error("run {0} is already paused or pausing")]
    AlreadyPaused(Uuid),
    /// 409 `already_posted`: an equivalent payload waits in the run's inbox.
    #[error("run {run_id}: {what} was already posted and waits for a worker")]
    AlreadyPosted {
        /// The run.
        run_id: Uuid,
        /// What.
        what: String,
    },
    /// 409 `head_moved`: a message or close carried `head_seq` (the run's
    /// head when the sender saw it waiting) and the run has moved on since:
    /// an earlier post of the same input landed and was taken, or another
    /// client answered. Nothing was posted.
    #[error("run {run_id} moved on: its head is {actual}, not {expected}")]
    HeadMoved {
        /// The run.
        run_id: Uuid,
        /// The head the post expected.
        expected: u64,
        /// The run's head now.
        actual: u64,
    },
    /// 409 `run_finished`: the run is done; nothing more can be posted.
    #[error("run {0} is finished")]
    RunFinished(Uuid),
    /// 409 `run_not_finished`: the run is not done, so its content cannot
    /// be erased; cancel it first.
    #[error("run {0} is not finished; cancel it before erasing it")]
    RunNotFinished(Uuid),
    /// 409 `run_leased`: a worker still holds the run (it is letting a
    /// finished run go); ask again in a moment.
    #[error("run {0} is still held by a worker; ask again in a moment")]
    RunLeased(Uuid),
    /// 409 `run_cancelled`: a cancel was posted and waits for a worker;
    /// nothing but the cancel is taken (the run ends cancelled).
    #[error("run {0} is being cancelled; nothing more is taken")]
    RunCancelled(Uuid),
    /// 409 `batch_ended`: pause or resume of a batch that ended
    /// (`completed`, `expired` or `cancelled`: nothing is left to pause or resume).
    #[error("batch {0} has ended ({1}); it cannot be paused or resumed")]
    BatchEnded(Uuid, &'static str),
    /// 409 `idempotency_conflict`: the `Idempotency-Key` was used for a different request.
    #[error("Idempotency-Key {0:?} was already used with a different goal, config or batch")]
    IdempotencyConflict(String),
    /// 400 `malformed_json`: the body is not JSON.
    #[error("malformed JSON body: {0}")]
    MalformedJson(String),
    /// 422 `invalid_body`: JSON of the wrong shape (wrong types, missing or unknown fields).
    #[error("invalid request body: {0}")]
    InvalidBody(String),
    /// 422 `invalid_body` naming the place (`field` in the body): the body
    /// does not conform to its schema in the OpenAPI document.
    #[error("invalid request body: {field}: {reason}")]
    BodyAt {
        /// Path of the offending value from the body's root, e.g. `config.budget`.
        field: String,
        /// What the document's schema says is wrong.
        reason: String,
    },
    /// 415 `unsupported_media_type`: a body without `Content-Type: application/json`.
    #[error("expected `Content-Type: application/json`")]
    UnsupportedMediaType,
    /// 413 `body_too_large`: the body exceeds the limit (bytes).
    #[error("request body exceeds {0} bytes")]
    BodyTooLarge(usize),
    /// 400 `invalid_body`-like failure reading the body (aborted upload).
    #[error("could not read the request body: {0}")]
    BodyRead(String),
    /// 400 `invalid_query`: query parameters of the wrong shape.
    #[error("invalid query: {0}")]
    InvalidQuery(String),
    /// 400 `invalid_query` naming the parameter (`field` in the body): an
    /// unknown one, a value of the wrong shape, a cursor not issued here.
    #[error("invalid query: {name}: {reason}")]
    InvalidParam {
        /// The query parameter.
        name: String,
        /// What is wrong with it.
        reason: String,
    },
    /// 400 `invalid_path`: a path parameter of the wrong shape (e.g. a run id that is not a UUID).
    #[error("invalid path: {0}")]
    InvalidPath(String),
    /// 400 `invalid_header`: a header of the wrong shape.
    #[error("invalid header {name}: {reason}")]
    InvalidHeader {
        /// Header name.
        name: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// 422 `invalid_request`: well-formed JSON whose values are not acceptable.
    #[error("{0}")]
    Invalid(String),
    /// 422 `invalid_request` naming the field (`field` in the body): e.g.
    /// `config.external_tools[1].input_schema: not a valid JSON Schema: …`.
    #[error("{field}: {reason}")]
    InvalidField {
        /// Path of the field from the body's root.
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// 422 `screened_input`: an input guardrail of the run's config refused
    /// the text in `field` (a `deny` rule, or `max_input_chars`); nothing
    /// was stored. The answer names the rule, its reason and the text's
    /// length, never the text.
    #[error(
        "{field}: refused by the input guardrail {guardrail} ({reason}); {chars} characters, not stored"
    )]
    ScreenedInput {
        /// Path of the refused text from the body's root (`goal`, `text`, `items[3].goal`).
        field: String,
        /// The rule's name (or `max_input_chars`).
        guardrail: String,
        /// The rule's reason, as its config gives it.
        reason: String,
        /// Length of the refused text, in characters.
        chars: usize,
    },
    /// 503 `log_unavailable`: the event log (Postgres) failed.
    #[error("event log unavailable: {0}")]
    LogUnavailable(String),
    /// 503 `queue_unavailable`: the job queue (RabbitMQ) failed.
    #[error("job queue unavailable: {0}")]
    QueueUnavailable(String),
    /// 503 `ledger_unavailable`: the ledger (Redis) failed.
    #[error("ledger unavailable: {0}")]
    LedgerUnavailable(String),
    /// 503 `not_ready`: a readiness check failed.
    #[error("not ready: {0}")]
    NotReady(String),
    /// 500 `corrupt_record`: a stored record does not decode; asking again
    /// gets the same answer. The message names the record (the run, the
    /// column), never its content; the dispatcher's log has the details.
    #[error("a stored record is corrupt: {0}; the dispatcher's log has the details")]
    CorruptRecord(String),
    /// 500 `internal`: a bug; the message says what.
    #[error("internal error: {0}")]
    Internal(String),
}

impl ApiError {
    /// The HTTP status and the stable snake_case code, declared together:
    /// one arm per variant (the message is the variant's `#[error]`).
    fn status_and_code(&self) -> (StatusCode, &'static str) {
        use ApiError::*;
        use StatusCode as S;
        match self {
            MissingToken => (S::UNAUTHORIZED, "missing_token"),
            InvalidToken => (S::UNAUTHORIZED, "invalid_token"),
            Forbidden(_) => (S::FORBIDDEN, "forbidden"),
            RouteNotFound(_) => (S::NOT_FOUND, "route_not_found"),
            NotAvailable(_) => (S::NOT_FOUND, "not_available"),
            MethodNotAllowed => (S::METHOD_NOT_ALLOWED, "method_not_allowed"),
            AgentNotFound(_) => (S::NOT_FOUND, "agent_not_found"),
            BatchNotFound(_) => (S::NOT_FOUND, "batch_not_found"),
            WebhookNotFound(_) => (S::NOT_FOUND, "webhook_not_found"),
            ScheduleNotFound(_) => (S::NOT_FOUND, "schedule_not_found"),
            ScheduleExists(_) => (S::CONFLICT, "schedule_exists"),
            DatasetNotFound(_) => (S::NOT_FOUND, "dataset_not_found"),
            ExperimentNotFound(_) => (S::NOT_FOUND, "experiment_not_found"),
            ExperimentEnded(_) => (S::CONFLICT, "experiment_ended"),
            InvalidLine {
                code: code @ "malformed_json",
                ..
            } => (S::BAD_REQUEST, code),
            InvalidLine { code, .. } => (S::UNPROCESSABLE_ENTITY, code),
            RunNotFound(_) => (S::NOT_FOUND, "run_not_found"),
            CallNotFound { .. } => (S::NOT_FOUND, "call_not_found"),
            ApprovalNotFound { .. } => (S::NOT_FOUND, "approval_not_found"),
            AlreadyDecided { .. } => (S::CONFLICT, "already_decided"),
            StaleArgs { .. } => (S::CONFLICT, "stale_args"),
            NotExternal(_) => (S::CONFLICT, "not_external"),
            AlreadyAnswered(_) => (S::CONFLICT, "already_answered"),
            NotAwaitingInput(_) => (S::CONFLICT, "not_awaiting_input"),
            NotPaused(_) => (S::CONFLICT, "not_paused"),
            AlreadyPaused(_) => (S::CONFLICT, "already_paused"),
            AlreadyPosted { .. } => (S::CONFLICT, "already_posted"),
            HeadMoved { .. } => (S::CONFLICT, "head_moved"),
            RunFinished(_) => (S::CONFLICT, "run_finished"),
            RunNotFinished(_) => (S::CONFLICT, "run_not_finished"),
            RunLeased(_) => (S::CONFLICT, "run_leased"),
            RunCancelled(_) => (S::CONFLICT, "run_cancelled"),
            BatchEnded(..) => (S::CONFLICT, "batch_ended"),
            IdempotencyConflict(_) => (S::CONFLICT, "idempotency_conflict"),
            MalformedJson(_) => (S::BAD_REQUEST, "malformed_json"),
            InvalidBody(_) => (S::UNPROCESSABLE_ENTITY, "invalid_body"),
            BodyAt { .. } => (S::UNPROCESSABLE_ENTITY, "invalid_body"),
            UnsupportedMediaType => (S::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type"),
            BodyTooLarge(_) => (S::PAYLOAD_TOO_LARGE, "body_too_large"),
            BodyRead(_) => (S::BAD_REQUEST, "body_unreadable"),
            InvalidQuery(_) | InvalidParam { .. } => (S::BAD_REQUEST, "invalid_query"),
            InvalidPath(_) => (S::BAD_REQUEST, "invalid_path"),
            InvalidHeader { .. } => (S::BAD_REQUEST, "invalid_header"),
            Invalid(_) => (S::UNPROCESSABLE_ENTITY, "invalid_request"),
            InvalidField { .. } => (S::UNPROCESSABLE_ENTITY, "invalid_request"),
            ScreenedInput { .. } => (S::UNPROCESSABLE_ENTITY, "screened_input"),
            LogUnavailable(_) => (S::SERVICE_UNAVAILABLE, "log_unavailable"),
            QueueUnavailable(_) => (S::SERVICE_UNAVAILABLE, "queue_unavailable"),
            LedgerUnavailable(_) => (S::SERVICE_UNAVAILABLE, "ledger_unavailable"),
            NotReady(_) => (S::SERVICE_UNAVAILABLE, "not_ready"),
            CorruptRecord(_) => (S::INTERNAL_SERVER_ERROR, "corrupt_record"),
            Internal(_) => (S::INTERNAL_SERVER_ERROR, "internal"),
        }
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        self.status_and_code().0
    }

    /// The stable snake_case code.
    pub fn code(&self) -> &'static str {
        self.status_and_code().1
    }

    /// The JSON body.
    pub fn body(&self) -> ErrorBody {
        let (field, line) = match self {
            ApiError::InvalidField { field, .. }
            | ApiError::InvalidParam { name: field, .. }
            | ApiError::BodyAt { field, .. }
            | ApiError::ScreenedInput { field, .. } => (Some(field.clone()), None),
            ApiError::InvalidLine { line, field, .. } => (field.clone(), Some(*line)),
            _ => (None, None),
        };
        ErrorBody {
            error: ErrorDetail {
                code: self.code().to_owned(),
                message: self.to_string(),
                field,
                line,
            },
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        if status.is_server_error() {
            tracing::warn!(code = self.code(), "{self}");
        }
        let mut response = (status, Json(self.body())).into_response();
        if status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

impl From<LogError> for ApiError {
    fn from(e: LogError) -> Self {
        match e {
            LogError::NotFound(run_id) => ApiError::RunNotFound(run_id),
            LogError::Unavailable(m) => ApiError::LogUnavailable(m),
            LogError::Duplicate { run_id, what } => ApiError::AlreadyPosted { run_id, what },
            LogError::Cancelled(run_id) => ApiError::RunCancelled(run_id),
            LogError::Finished(run_id) => ApiError::RunFinished(run_id),
            LogError::NotFinished(run_id) => ApiError::RunNotFinished(run_id),
            LogError::LeaseHeld { run_id, .. } => ApiError::RunLeased(run_id),
            LogError::Corrupt(what) => {
                tracing::error!(code = "corrupt_record", "corrupt record: {what}");
                ApiError::CorruptRecord(record_name(&what).to_owned())
            }
            other => ApiError::Internal(other.to_string()),
        }
    }
}

/// The record a [`LogError::Corrupt`] names (`column config`, `run … has no
/// events`): its text up to the decoder's own words, which may quote the
/// stored value.
fn record_name(what: &str) -> &str {
    what.split(": ").next().unwrap_or(what)
}

impl From<QueueError> for ApiError {
    fn from(e: QueueError) -> Self {
        ApiError::QueueUnavailable(e.to_string())
    }
}

impl From<LedgerError> for ApiError {
    fn from(e: LedgerError) -> Self {
        ApiError::LedgerUnavailable(e.to_string())
    }
}
