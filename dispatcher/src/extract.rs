//! Extractors that turn every malformed request into an [`ApiError`] (JSON,
//! stable code) instead of axum's plain-text rejections.

use std::collections::HashMap;
use std::sync::{LazyLock, OnceLock};

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use glia_proto::json::integral_numbers;
use serde::de::DeserializeOwned;

use crate::app::App;
use crate::auth::Principal;
use crate::error::ApiError;
use crate::model::Documented;

/// A required JSON body: `Content-Type: application/json` (or `…+json`),
/// at most [`crate::Limits::max_body_bytes`]. Errors: 415
/// `unsupported_media_type`, 413 `body_too_large`, 400 `malformed_json`,
/// 422 `invalid_body`.
pub struct ApiJson<T>(pub T);

/// An optional JSON body: no body (or whitespace without a JSON content
/// type) is `T::default()`; otherwise as [`ApiJson`] (so `\n` sent as JSON
/// is 400 `malformed_json`).
pub struct OptJson<T>(pub T);

/// Query parameters; errors are 400 `invalid_query`.
pub struct ApiQuery<T>(pub T);

/// Path parameters; errors are 400 `invalid_path`.
pub struct ApiPath<T>(pub T);

pub(crate) fn is_json(headers: &HeaderMap) -> bool {
    let Some(ct) = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let Ok(mime) = ct.parse::<mime_lite::Mime>() else {
        return false;
    };
    mime.is_json()
}

pub(crate) async fn body(req: Request, app: &App) -> Result<(HeaderMap, Bytes), ApiError> {
    let headers = req.headers().clone();
    let bytes = Bytes::from_request(req, app).await.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::BodyTooLarge(app.limits.max_body_bytes)
        } else {
            ApiError::BodyRead(rejection.body_text())
        }
    })?;
    Ok((headers, bytes))
}

/// The OpenAPI document bodies are checked against: given by the router
/// ([`crate::server::router`]) before it serves anything, so this module
/// needs nothing from the handlers the document is built from.
static DOCUMENT: OnceLock<fn() -> serde_json::Value> = OnceLock::new();

/// Check every body against the document `document` builds (the first
/// call wins; the document is one per build).
pub(crate) fn check_bodies_against(document: fn() -> serde_json::Value) {
    let _ = DOCUMENT.set(document);
}

/// Every component schema of the document, compiled once (references
/// resolve within the document).
static VALIDATORS: LazyLock<HashMap<String, jsonschema::Validator>> = LazyLock::new(|| {
    let doc = DOCUMENT
        .get()
        .expect("the router gives the document before a body is checked")();
    let names: Vec<String> = doc["components"]["schemas"]
        .as_object()
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default();
    names
        .into_iter()
        .map(|name| {
            let root = serde_json::json!({"$ref": format!("#/components/schemas/{name}"), "components": doc["components"].clone()});
            let validator = jsonschema::validator_for(&root).unwrap_or_else(|e| panic!("component schema {name} compiles: {e}"));
            (name, validator)
        })
        .collect()
});

/// Check `value` against the document's schema `name`. Errors: 422
/// `invalid_body` naming the first offending place (`config.budget: … is
/// not of type "object"`).
pub(crate) fn conforms(name: &str, value: &serde_json::Value) -> Result<(), ApiError> {
    let Some(validator) = VALIDATORS.get(name) else {
        return Err(ApiError::Internal(format!(
            "no schema {name} in the OpenAPI document"
        )));
    };
    match validator.iter_errors(value).next() {
        None => Ok(()),
        Some(e) => Err(located(&e)),
    }
}

/// The error of a failed check, naming the place: inside an `anyOf` or
/// `oneOf` (an optional object is `anyOf: [null, {…}]`) the branch error
/// that names the deepest place is the one the caller meant; an unknown key
/// is named itself (`config.compactor: unknown field`).
fn located(e: &jsonschema::ValidationError<'_>) -> ApiError {
    let (field, reason) = place(e);
    if field.is_empty() {
        ApiError::InvalidBody(reason)
    } else {
        ApiError::BodyAt { field, reason }
    }
}

/// `(field, reason)` of a schema error; see [`located`]. (Also how the
/// MCP server names the field of a tool's arguments.)
pub(crate) fn place(e: &jsonschema::ValidationError<'_>) -> (String, String) {
    use jsonschema::error::ValidationErrorKind as Kind;
    let pointer = e.instance_path().to_string();
    let mut field = String::new();
    for token in pointer.split('/').skip(1) {
        let token = token.replace("~1", "/").replace("~0", "~");
        if !field.is_empty() && token.bytes().all(|b| b.is_ascii_digit()) {
            field.push_str(&format!("[{token}]"));
        } else {
            if !field.is_empty() {
                field.push('.');
            }
            field.push_str(&token);
        }
    }
    match e.kind() {
        Kind::AnyOf { context } | Kind::OneOfNotValid { context } => {
            match context
                .iter()
                .flatten()
                .map(place)
                .max_by_key(|(f, _)| f.len())
            {
                Some(deepest) if deepest.0.len() > field.len() => deepest,
                _ => (field, e.to_string()),
            }
        }
        // Said without the instance (a list over its bound may be long).
        Kind::MaxItems { limit } => {
            let items = e.instance().as_array().map_or(0, Vec::len);
            (
                field,
                format!("{items} items, more than the {limit} allowed"),
            )
        }
        Kind::AdditionalProperties { unexpected } if !unexpected.is_empty() => (
            if field.is_empty() {
                unexpected[0].clone()
            } else {
                format!("{field}.{}", unexpected[0])
            },
            "unknown field".into(),
        ),
        _ => (field, e.to_string()),
    }
}

pub(crate) fn parse<T: DeserializeOwned + Documented>(
    headers: &HeaderMap,
    bytes: &[u8],
) -> Result<T, ApiError> {
    if !is_json(headers) {
        return Err(ApiError::UnsupportedMediaType);
    }
    // Syntax first, so a truncated body is `malformed_json` even when its
    // start already has the wrong shape; then the shape: every body is an object.
    let mut value: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| ApiError::MalformedJson(e.to_string()))?;
    if !value.is_object() {
        return Err(ApiError::InvalidBody(
            "the body must be a JSON object".into(),
        ));
    }
    integral_numbers(&mut value);
    conforms(T::SCHEMA, &value)?;
    glia_proto::strict::from_json_value(value).map_err(|e| {
        if e.path.is_empty() {
            ApiError::InvalidBody(e.reason)
        } else {
            ApiError::BodyAt {
                field: e.path,
                reason: e.reason,
            }
        }
    })
}

impl<T: DeserializeOwned + Documented> FromRequest<App> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, app: &App) -> Result<Self, Self::Rejection> {
        let (headers, bytes) = body(req, app).await?;
        parse(&headers, &bytes).map(ApiJson)
    }
}

impl<T: DeserializeOwned + Default + Documented> FromRequest<App> for OptJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, app: &App) -> Result<Self, Self::Rejection> {
        let (headers, bytes) = body(req, app).await?;
        // No body is the default; a body that says it is JSON must be JSON
        // (whitespace alone is not).
        if bytes.is_empty() || (!is_json(&headers) && bytes.iter().all(u8::is_ascii_whitespace)) {
            return Ok(OptJson(T::default()));
        }
        parse(&headers, &bytes).map(OptJson)
    }
}

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Query::<T>::try_from_uri(&parts.uri)
            .map(|Query(q)| ApiQuery(q))
            .map_err(|e| ApiError::InvalidQuery(e.body_text()))
    }
}

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for ApiPath<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        Path::<T>::from_request_parts(parts, state)
            .await
            .map(|Path(p)| ApiPath(p))
            .map_err(|e| ApiError::InvalidPath(e.body_text()))
    }
}

/// Just enough media-type parsing to recognise JSON: `type/subtype` with
/// optional parameters, case-insensitive.
/// The caller, from `Authorization: Bearer …` ([`crate::auth::Auth::authenticate`]).
impl FromRequestParts<App> for Principal {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, app: &App) -> Result<Self, Self::Rejection> {
        let header = match parts.headers.get(header::AUTHORIZATION) {
            Some(v) => Some(v.to_str().map_err(|_| ApiError::InvalidToken)?),
            None => None,
        };
        app.auth.authenticate(header)
    }
}

mod mime_lite {
    pub struct Mime {
        ty: String,
        subtype: String,
    }

    impl std::str::FromStr for Mime {
        type Err = ();

        fn from_str(s: &str) -> Result<Self, ()> {
            let essence = s
                .split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase();
            let (ty, subtype) = essence.split_once('/').ok_or(())?;
            if ty.is_empty() || subtype.is_empty() {
                return Err(());
            }
            Ok(Mime {
                ty: ty.to_owned(),
                subtype: subtype.to_owned(),
            })
        }
    }

    impl Mime {
        pub fn is_json(&self) -> bool {
            self.ty == "application" && (self.subtype == "json" || self.subtype.ends_with("+json"))
        }
    }
}
