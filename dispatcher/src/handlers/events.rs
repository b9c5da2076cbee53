//! `POST /v1/events` (issue 32, `docs/waits.md`): an event for the runs of
//! the caller's tenant waiting on its key.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;

use crate::app::App;
use crate::auth::{Principal, Scope};
use crate::error::{ApiError, ErrorBody};
use crate::extract::ApiJson;
use crate::model::{EventAccepted, EventBody};
use crate::waits::{arrived, deliver};

/// Post an event: every run of the caller's tenant parked in
/// `wait_for_event` on `key` gets `payload` as the call's result. The event
/// is kept for the retention (default 15 minutes), so a wait on `key` that
/// begins within it gets it too; a run never gets the same event twice.
/// Another tenant's waits never see it. Scope `submit`.
#[utoipa::path(post, path = "/v1/events", tag = "events", request_body = EventBody,
    responses((status = 202, body = EventAccepted), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 413, body = ErrorBody), (status = 415, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn post_event(
    State(app): State<App>,
    p: Principal,
    ApiJson(body): ApiJson<EventBody>,
) -> Result<(StatusCode, Json<EventAccepted>), ApiError> {
    p.require(Scope::Submit)?;
    if !glia_proto::wait::valid_event_key(&body.key) {
        return Err(ApiError::InvalidField {
            field: "key".into(),
            reason: format!(
                "must be 1 to {} characters of letters, digits and . _ : / @ -",
                glia_proto::wait::MAX_EVENT_KEY_LEN
            ),
        });
    }
    let text = body.payload.to_string();
    if text.len() > glia_proto::wait::MAX_EVENT_PAYLOAD_BYTES {
        return Err(ApiError::InvalidField {
            field: "payload".into(),
            reason: format!(
                "is {} bytes of JSON; at most {}",
                text.len(),
                glia_proto::wait::MAX_EVENT_PAYLOAD_BYTES
            ),
        });
    }
    if text.contains("\\u0000") {
        return Err(ApiError::InvalidField {
            field: "payload".into(),
            reason: "holds U+0000, which no store keeps".into(),
        });
    }
    let event = arrived(body.id, body.key, body.payload);
    let kept = app.log.keep_event(&p.tenant, &event).await?;
    let delivered = deliver(&app, Some((&p.tenant, event.id))).await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(EventAccepted {
            id: event.id,
            delivered,
            duplicate: !kept,
        }),
    ))
}
