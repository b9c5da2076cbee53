//! `/v1/batches`: submit (JSON or JSON Lines read as it arrives), list,
//! progress, results, SSE, cancel, pause, resume. See [`crate::batches`].

use std::convert::Infallible;
use std::time::Duration;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::stream::BoxStream;
use futures::{Stream, StreamExt, TryStreamExt};
use glia_backends::SpendCap;
use glia_backends::batches::{BatchState, SubmitError, Upload};
use serde_json::Value;
use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::admission::idempotency_key;
use crate::app::App;
use crate::auth::{Principal, Scope};
use crate::error::{ApiError, ErrorBody};
use crate::extract::{ApiJson, ApiPath, ApiQuery, OptJson, conforms, is_json};
use glia_proto::json::integral_numbers;

use crate::batches::*;
use crate::model::batches::*;

/// The error a refused submission answers, placing it at `line` (JSON
/// Lines) or `items[i]` (JSON).
fn submit_error(e: SubmitError, jsonl: bool) -> ApiError {
    let place = |line: u64, field: Option<String>| -> String {
        match (jsonl, field) {
            (true, Some(f)) => f,
            (true, None) => String::new(),
            (false, Some(f)) => format!("items[{line}].{f}"),
            (false, None) => format!("items[{line}]"),
        }
    };
    match e {
        SubmitError::Input {
            item: Some(line),
            field,
            reason,
        } if jsonl => ApiError::InvalidLine {
            line,
            field,
            code: "invalid_request",
            reason,
        },
        SubmitError::Input {
            item: Some(line),
            field,
            reason,
        } => ApiError::InvalidField {
            field: place(line, field),
            reason,
        },
        SubmitError::Input {
            item: None,
            field: Some(field),
            reason,
        } => ApiError::InvalidField { field, reason },
        SubmitError::Input {
            item: None,
            field: None,
            reason,
        } => ApiError::Invalid(reason),
        SubmitError::DuplicateCustomId { line, custom_id } if jsonl => ApiError::InvalidLine {
            line,
            field: Some("custom_id".into()),
            code: "invalid_request",
            reason: format!("custom_id {custom_id:?} is used by an earlier line"),
        },
        SubmitError::DuplicateCustomId { line, custom_id } => ApiError::InvalidField {
            field: place(line, Some("custom_id".into())),
            reason: format!("custom_id {custom_id:?} is used by an earlier item"),
        },
        SubmitError::Truncated => ApiError::BodyRead("the upload ended early".into()),
        SubmitError::Other(e) => match e.downcast::<ApiError>() {
            Ok(e) => *e,
            Err(e) => ApiError::Invalid(e.to_string()),
        },
        SubmitError::Log(e) => e.into(),
    }
}

// ----- submission -----------------------------------------------------------------------

/// Submit a batch: JSON ([`CreateBatch`]) or JSON Lines (line 1 a
/// [`BatchSpec`], then one [`BatchItem`] per line), stored whole or not at
/// all. With an `Idempotency-Key` the tenant used before: 200 with that
/// batch (409 `idempotency_conflict` when the request differs). Errors name
/// the field, and for JSON Lines the `line`.
#[utoipa::path(post, path = "/v1/batches", tag = "batches",
    request_body(content((CreateBatch = "application/json"), (String = "application/jsonl")), description = "JSON, or JSON Lines: line 1 a BatchSpec, then one BatchItem per line"),
    params(("Idempotency-Key" = Option<String>, Header, description = "Per-tenant idempotency key, 1 to 255 visible ASCII characters")),
    responses(
        (status = 201, description = "Stored; items are admitted progressively", body = BatchView),
        (status = 200, description = "Idempotent repeat: the existing batch", body = BatchView),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody), (status = 413, body = ErrorBody), (status = 415, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn create(
    State(app): State<App>,
    p: Principal,
    request: Request,
) -> Result<Response, ApiError> {
    p.require(Scope::Submit)?;
    let store = store(&app)?.clone();
    let key = idempotency_key(request.headers())?;
    let headers = request.headers().clone();
    let (submitted, hash) = if is_jsonl(&headers) {
        let mut lines = Lines::new(request.into_body(), &app.batches.admission);
        let Some((line, first)) = lines.next_line().await? else {
            return Err(ApiError::InvalidBody(
                "the upload is empty: line 1 must be the batch spec".into(),
            ));
        };
        let mut spec: BatchSpec = parse_line(line, &first, "BatchSpec")?;
        let config = check_spec(&app, &p.tenant, &mut spec).await?;
        let new = new_batch(&p, key.clone(), &spec);
        let upload = jsonl_upload(
            lines,
            ItemRules::new(&app, &spec, &config)?,
            app.batches.admission.max_items,
        );
        let submitted = store
            .submit(new, upload)
            .await
            .map_err(|e| submit_error(e, true))?;
        let hash = submitted.upload_hash.clone();
        (submitted, hash)
    } else {
        if !is_json(&headers) {
            return Err(ApiError::UnsupportedMediaType);
        }
        let ApiJson(body) =
            <ApiJson<CreateBatch> as axum::extract::FromRequest<App>>::from_request(request, &app)
                .await?;
        let hash = hex(&Sha256::digest(
            serde_json::to_vec(&body).expect("a body serialises"),
        ));
        let mut spec = BatchSpec {
            config: body.config,
            agent: body.agent,
            options: body.options,
        };
        let config = check_spec(&app, &p.tenant, &mut spec).await?;
        if body.items.len() as u64 > app.batches.admission.max_items {
            return Err(ApiError::InvalidField {
                field: "items".into(),
                reason: format!("at most {} items", app.batches.admission.max_items),
            });
        }
        let rules = ItemRules::new(&app, &spec, &config)?;
        let mut items = Vec::with_capacity(body.items.len());
        for (i, item) in body.items.into_iter().enumerate() {
            items.push(prepare(item, i as u64, &rules).map_err(|(field, reason)| {
                submit_error(
                    SubmitError::Input {
                        item: Some(i as u64),
                        field,
                        reason,
                    },
                    false,
                )
            })?);
        }
        let mut chunks: Vec<Result<Upload, SubmitError>> = Vec::new();
        let mut rest = items.into_iter().peekable();
        while rest.peek().is_some() {
            chunks.push(Ok(Upload::Items(rest.by_ref().take(CHUNK).collect())));
        }
        chunks.push(Ok(Upload::Done {
            request_hash: hash.clone(),
        }));
        let submitted = store
            .submit(
                new_batch(&p, key.clone(), &spec),
                futures::stream::iter(chunks).boxed(),
            )
            .await
            .map_err(|e| submit_error(e, false))?;
        (submitted, hash)
    };
    if !submitted.created {
        if submitted.batch.request_hash != hash {
            return Err(ApiError::IdempotencyConflict(key.unwrap_or_default()));
        }
        return Ok((
            StatusCode::OK,
            Json(full_view(&app, &submitted.batch).await?),
        )
            .into_response());
    }
    tracing::info!(batch_id = %submitted.batch.id, tenant = %p.tenant, items = submitted.batch.items_total, "batch submitted");
    app.wake_admission();
    let location = HeaderValue::from_str(&format!("/v1/batches/{}", submitted.batch.id))
        .expect("a uuid path is a valid header");
    Ok((
        StatusCode::CREATED,
        [(header::LOCATION, location)],
        Json(full_view(&app, &submitted.batch).await?),
    )
        .into_response())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn is_jsonl(headers: &HeaderMap) -> bool {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let essence = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    matches!(
        essence.as_str(),
        "application/jsonl"
            | "application/x-ndjson"
            | "application/jsonlines"
            | "application/x-jsonlines"
    )
}

/// Parse one line as the document's schema `name`: 400 `malformed_json` or
/// 422 naming the line and the field.
fn parse_line<T: serde::de::DeserializeOwned>(
    line: u64,
    text: &[u8],
    name: &str,
) -> Result<T, ApiError> {
    let mut value: Value = serde_json::from_slice(text).map_err(|e| ApiError::InvalidLine {
        line,
        field: None,
        code: "malformed_json",
        reason: e.to_string(),
    })?;
    if !value.is_object() {
        return Err(ApiError::InvalidLine {
            line,
            field: None,
            code: "invalid_body",
            reason: "each line must be a JSON object".into(),
        });
    }
    integral_numbers(&mut value);
    conforms(name, &value).map_err(|e| match e {
        ApiError::BodyAt { field, reason } => ApiError::InvalidLine {
            line,
            field: Some(field),
            code: "invalid_body",
            reason,
        },
        other => ApiError::InvalidLine {
            line,
            field: None,
            code: "invalid_body",
            reason: other.to_string(),
        },
    })?;
    serde_json::from_value(value).map_err(|e| ApiError::InvalidLine {
        line,
        field: None,
        code: "invalid_body",
        reason: e.to_string(),
    })
}

/// A request body read line by line as it arrives, hashing every byte.
struct Lines {
    body: BoxStream<'static, Result<Bytes, axum::Error>>,
    buf: Vec<u8>,
    line: u64,
    read: u64,
    ended: bool,
    hash: Sha256,
    max_bytes: u64,
    max_line: usize,
}

impl Lines {
    fn new(body: Body, limits: &Admission) -> Lines {
        Lines {
            body: body.into_data_stream().boxed(),
            buf: Vec::new(),
            line: 0,
            read: 0,
            ended: false,
            hash: Sha256::new(),
            max_bytes: limits.max_upload_bytes,
            max_line: limits.max_line_bytes,
        }
    }

    /// The next non-blank line with its number (from 1), or `None` at the end.
    async fn next_line(&mut self) -> Result<Option<(u64, Vec<u8>)>, ApiError> {
        loop {
            if let Some(pos) = self.buf.iter().position(|&b| b == b'\n') {
                let mut line: Vec<u8> = self.buf.drain(..=pos).collect();
                line.pop();
                self.line += 1;
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                return Ok(Some((self.line, line)));
            }
            if self.buf.len() > self.max_line {
                return Err(ApiError::InvalidLine {
                    line: self.line + 1,
                    field: None,
                    code: "invalid_body",
                    reason: format!("longer than {} bytes", self.max_line),
                });
            }
            if self.ended {
                if self.buf.iter().all(u8::is_ascii_whitespace) {
                    return Ok(None);
                }
                self.line += 1;
                return Ok(Some((self.line, std::mem::take(&mut self.buf))));
            }
            match self.body.next().await {
                None => self.ended = true,
                Some(Err(e)) => return Err(ApiError::BodyRead(e.to_string())),
                Some(Ok(chunk)) => {
                    self.read += chunk.len() as u64;
                    if self.read > self.max_bytes {
                        return Err(ApiError::BodyTooLarge(
                            self.max_bytes.min(usize::MAX as u64) as usize,
                        ));
                    }
                    self.hash.update(&chunk);
                    self.buf.extend_from_slice(&chunk);
                }
            }
        }
    }
}

/// The items of a JSON Lines upload after its spec line, in chunks of
/// [`CHUNK`], then [`Upload::Done`] with the hash of every byte.
fn jsonl_upload(
    lines: Lines,
    rules: ItemRules,
    max_items: u64,
) -> BoxStream<'static, Result<Upload, SubmitError>> {
    futures::stream::unfold(Some((lines, rules, 0u64)), move |state| async move {
        let (mut lines, rules, mut count) = state?;
        let mut chunk = Vec::with_capacity(CHUNK);
        while chunk.len() < CHUNK {
            match lines.next_line().await {
                Err(e) => return Some((Err(SubmitError::Other(Box::new(e))), None)),
                Ok(None) => break,
                Ok(Some((line, text))) => {
                    count += 1;
                    if count > max_items {
                        return Some((
                            Err(SubmitError::Input {
                                item: Some(line),
                                field: None,
                                reason: format!("at most {max_items} items per batch"),
                            }),
                            None,
                        ));
                    }
                    let item = match parse_line::<BatchItem>(line, &text, "BatchItem") {
                        Ok(item) => item,
                        Err(e) => return Some((Err(SubmitError::Other(Box::new(e))), None)),
                    };
                    match prepare(item, line, &rules) {
                        Ok(item) => chunk.push(item),
                        Err((field, reason)) => {
                            return Some((
                                Err(SubmitError::Input {
                                    item: Some(line),
                                    field,
                                    reason,
                                }),
                                None,
                            ));
                        }
                    }
                }
            }
        }
        if chunk.is_empty() {
            if count == 0 {
                return Some((
                    Err(SubmitError::Input {
                        item: None,
                        field: None,
                        reason: "the batch has no items (line 2 on are items)".into(),
                    }),
                    None,
                ));
            }
            let request_hash = hex(&lines.hash.clone().finalize());
            return Some((Ok(Upload::Done { request_hash }), None));
        }
        Some((Ok(Upload::Items(chunk)), Some((lines, rules, count))))
    })
    .boxed()
}

// ----- reading ----------------------------------------------------------------------

/// List batches visible to the caller, by id (creation order).
#[utoipa::path(get, path = "/v1/batches", tag = "batches", params(ListBatchesQuery),
    responses((status = 200, body = BatchPage), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list(
    State(app): State<App>,
    p: Principal,
    ApiQuery(q): ApiQuery<ListBatchesQuery>,
) -> Result<Json<BatchPage>, ApiError> {
    let limit = match q.limit {
        None => app.limits.default_page,
        Some(n) if (1..=app.limits.max_page).contains(&n) => n,
        Some(n) => {
            return Err(ApiError::InvalidQuery(format!(
                "limit {n} is outside 1..={}",
                app.limits.max_page
            )));
        }
    };
    let batches = store(&app)?.batches(tenant_of(&p), q.after, limit).await?;
    let next = (batches.len() == limit)
        .then(|| batches.last().map(|b| b.id))
        .flatten();
    // Each as the single get shows it (the same status function, counts and spend).
    let views = futures::stream::iter(batches)
        .map(|b| {
            let app = app.clone();
            async move { full_view(&app, &b).await }
        })
        .buffered(8)
        .try_collect()
        .await?;
    Ok(Json(BatchPage {
        batches: views,
        next,
    }))
}

/// One batch: state, counts by what became of the items, spend so far.
#[utoipa::path(get, path = "/v1/batches/{id}", tag = "batches", params(("id" = Uuid, Path, description = "Batch id")),
    responses((status = 200, body = BatchView), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn get(
    State(app): State<App>,
    p: Principal,
    ApiPath(id): ApiPath<Uuid>,
) -> Result<Json<BatchView>, ApiError> {
    let batch = visible_batch(&app, &p, id).await?;
    Ok(Json(full_view(&app, &batch).await?))
}

/// Every item's result as JSON Lines, in submission order, streamed (one
/// [`ItemResult`] per line; items not finished show their status).
#[utoipa::path(get, path = "/v1/batches/{id}/results", tag = "batches", params(("id" = Uuid, Path, description = "Batch id")),
    responses((status = 200, description = "One ItemResult per line", content_type = "application/jsonl", body = String), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn results(
    State(app): State<App>,
    p: Principal,
    ApiPath(id): ApiPath<Uuid>,
) -> Result<Response, ApiError> {
    let batch = visible_batch(&app, &p, id).await?;
    results_response(&app, &batch)
}

/// The batch's progress as server-sent events: a `progress` frame (a
/// [`BatchView`]) now and whenever it changes (checked every second); the
/// stream ends after the frame that shows it completed or cancelled with no
/// run left.
#[utoipa::path(get, path = "/v1/batches/{id}/stream", tag = "batches", params(("id" = Uuid, Path, description = "Batch id")),
    responses((status = 200, description = "Server-sent events; the schema describes one event (frame) of the stream", content_type = "text/event-stream", body = crate::docs::BatchProgressEventDoc), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn stream(
    State(app): State<App>,
    p: Principal,
    ApiPath(id): ApiPath<Uuid>,
) -> Result<Response, ApiError> {
    let batch = visible_batch(&app, &p, id).await?;
    let frames = progress(app, p, batch.id);
    Ok(Sse::new(frames)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response())
}

fn progress(app: App, p: Principal, id: Uuid) -> impl Stream<Item = Result<SseEvent, Infallible>> {
    futures::stream::unfold((None::<BatchView>, false), move |(last, done)| {
        let (app, p) = (app.clone(), p.clone());
        async move {
            if done {
                return None;
            }
            let mut first = last.is_none();
            loop {
                if !first {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                first = false;
                let Ok(batch) = visible_batch(&app, &p, id).await else {
                    continue;
                };
                let Ok(now) = full_view(&app, &batch).await else {
                    continue;
                };
                let comparable =
                    |v: &BatchView| (v.status, v.counts.clone(), v.spend, v.cap_reached);
                if last.as_ref().map(comparable) == Some(comparable(&now)) {
                    continue;
                }
                let finished = now.counts.open() == 0;
                let frame = SseEvent::default()
                    .event("progress")
                    .data(serde_json::to_string(&now).expect("a view serialises"));
                return Some((Ok(frame), (Some(now), finished)));
            }
        }
    })
}

/// Cancel a batch: nothing more is started, items not started are
/// `cancelled`, and every run not done gets a cancel (as `POST
/// /v1/runs/{id}/cancel`).
#[utoipa::path(post, path = "/v1/batches/{id}/cancel", tag = "batches", params(("id" = Uuid, Path, description = "Batch id")),
    responses((status = 200, body = BatchView), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn cancel(
    State(app): State<App>,
    p: Principal,
    ApiPath(id): ApiPath<Uuid>,
) -> Result<Json<BatchView>, ApiError> {
    p.require(Scope::Submit)?;
    let batch = cancel_batch(&app, tenant_of(&p), id, &p.by()).await?;
    Ok(Json(full_view(&app, &batch).await?))
}

/// Pause a batch: nothing more is started, and every run of it not done
/// gets an operator pause (see the module doc): it parks at `paused` at its
/// next step boundary. A batch that ended answers 409 `batch_ended`.
#[utoipa::path(post, path = "/v1/batches/{id}/pause", tag = "batches", params(("id" = Uuid, Path, description = "Batch id")),
    responses((status = 200, body = BatchView), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, description = "`batch_ended`: the batch completed, expired or was cancelled", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn pause(
    State(app): State<App>,
    p: Principal,
    ApiPath(id): ApiPath<Uuid>,
) -> Result<Json<BatchView>, ApiError> {
    p.require(Scope::Submit)?;
    let store = store(&app)?;
    not_ended(&app, &p, id).await?;
    let batch = store
        .update(tenant_of(&p), id, Some(BatchState::Paused), None)
        .await?
        .ok_or(ApiError::BatchNotFound(id))?;
    if batch.state == BatchState::Paused {
        park_runs(
            &app,
            id,
            &format!("batch {id} paused by {}", p.by()),
            &p.by(),
        )
        .await?;
        // Resumed meanwhile (a concurrent `resume` passed these runs before
        // their pause was posted): take the pauses back.
        if store
            .batch(None, id)
            .await?
            .is_some_and(|b| b.state == BatchState::Active)
        {
            resume_parked(&app, id, &p.by()).await?;
        }
    }
    Ok(Json(full_view(&app, &batch).await?))
}

/// Resume a paused batch, optionally replacing its spend cap (a batch that
/// reached its cap starts items again once the cap is above its spend). A
/// batch that ended (completed, expired, cancelled) answers 409 `batch_ended`.
#[utoipa::path(post, path = "/v1/batches/{id}/resume", tag = "batches", request_body(content = ResumeBatchBody, description = "May be empty"),
    params(("id" = Uuid, Path, description = "Batch id")),
    responses((status = 200, body = BatchView), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, description = "`batch_ended`: the batch completed, expired or was cancelled", body = ErrorBody),
        (status = 413, body = ErrorBody), (status = 415, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn resume(
    State(app): State<App>,
    p: Principal,
    ApiPath(id): ApiPath<Uuid>,
    OptJson(body): OptJson<ResumeBatchBody>,
) -> Result<Json<BatchView>, ApiError> {
    p.require(Scope::Submit)?;
    let cap = body.spend_cap.map(SpendCap::from);
    let store = store(&app)?;
    not_ended(&app, &p, id).await?;
    let batch = store
        .update(tenant_of(&p), id, Some(BatchState::Active), cap)
        .await?
        .ok_or(ApiError::BatchNotFound(id))?;
    // Only the runs this batch paused (its pause, or its spend cap), and not
    // while the cap is still reached: the next pass would pause them again.
    let capped = batch.cap != SpendCap::default() && reached(batch.cap, store.spend(id).await?);
    if batch.state == BatchState::Active && !capped {
        resume_parked(&app, id, &p.by()).await?;
    }
    app.wake_admission();
    Ok(Json(full_view(&app, &batch).await?))
}
