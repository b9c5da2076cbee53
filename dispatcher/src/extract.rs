//! Extractors that turn every malformed request into an [`ApiError`] (JSON,
//! stable code) instead of axum's plain-text rejections.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use serde::de::DeserializeOwned;

use crate::App;
use crate::error::ApiError;

/// A required JSON body: `Content-Type: application/json` (or `…+json`),
/// at most [`crate::Limits::max_body_bytes`]. Errors: 415
/// `unsupported_media_type`, 413 `body_too_large`, 400 `malformed_json`,
/// 422 `invalid_body`.
pub struct ApiJson<T>(pub T);

/// An optional JSON body: an empty body is `T::default()`; otherwise as [`ApiJson`].
pub struct OptJson<T>(pub T);

/// Query parameters; errors are 400 `invalid_query`.
pub struct ApiQuery<T>(pub T);

/// Path parameters; errors are 400 `invalid_path`.
pub struct ApiPath<T>(pub T);

fn is_json(headers: &HeaderMap) -> bool {
    let Some(ct) = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()) else { return false };
    let Ok(mime) = ct.parse::<mime_lite::Mime>() else { return false };
    mime.is_json()
}

async fn body(req: Request, app: &App) -> Result<(HeaderMap, Bytes), ApiError> {
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

fn parse<T: DeserializeOwned>(headers: &HeaderMap, bytes: &[u8]) -> Result<T, ApiError> {
    if !is_json(headers) {
        return Err(ApiError::UnsupportedMediaType);
    }
    // Syntax first, so a truncated body is `malformed_json` even when its
    // start already has the wrong shape; then the shape: every body is an object.
    let value: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| ApiError::MalformedJson(e.to_string()))?;
    if !value.is_object() {
        return Err(ApiError::InvalidBody("the body must be a JSON object".into()));
    }
    serde_json::from_value(value).map_err(|e| ApiError::InvalidBody(e.to_string()))
}

impl<T: DeserializeOwned> FromRequest<App> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, app: &App) -> Result<Self, Self::Rejection> {
        let (headers, bytes) = body(req, app).await?;
        parse(&headers, &bytes).map(ApiJson)
    }
}

impl<T: DeserializeOwned + Default> FromRequest<App> for OptJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, app: &App) -> Result<Self, Self::Rejection> {
        let (headers, bytes) = body(req, app).await?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(OptJson(T::default()));
        }
        parse(&headers, &bytes).map(OptJson)
    }
}

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Query::<T>::try_from_uri(&parts.uri).map(|Query(q)| ApiQuery(q)).map_err(|e| ApiError::InvalidQuery(e.body_text()))
    }
}

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for ApiPath<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        Path::<T>::from_request_parts(parts, state).await.map(|Path(p)| ApiPath(p)).map_err(|e| ApiError::InvalidPath(e.body_text()))
    }
}

/// Just enough media-type parsing to recognise JSON: `type/subtype` with
/// optional parameters, case-insensitive.
mod mime_lite {
    pub struct Mime {
        ty: String,
        subtype: String,
    }

    impl std::str::FromStr for Mime {
        type Err = ();

        fn from_str(s: &str) -> Result<Self, ()> {
            let essence = s.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
            let (ty, subtype) = essence.split_once('/').ok_or(())?;
            if ty.is_empty() || subtype.is_empty() {
                return Err(());
            }
            Ok(Mime { ty: ty.to_owned(), subtype: subtype.to_owned() })
        }
    }

    impl Mime {
        pub fn is_json(&self) -> bool {
            self.ty == "application" && (self.subtype == "json" || self.subtype.ends_with("+json"))
        }
    }
}
