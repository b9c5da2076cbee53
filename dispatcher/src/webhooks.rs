//! Webhooks: per-tenant subscriptions (API) and the deliverer that sends the
//! durable outbox of [`glia_backends::webhooks`].
//!
//! | endpoint | scope | success | errors |
//! |---|---|---|---|
//! | `POST /v1/webhooks` | submit or approve | 201 subscription with its `secret` (shown once) | 422 `invalid_request` (URL refused, unknown event type) |
//! | `GET /v1/webhooks` | submit or approve | 200 subscriptions (no secrets) | – |
//! | `DELETE /v1/webhooks/{id}` | submit or approve | 204 | 404 `route_not_found` (no such subscription of the tenant) |
//! | `GET /v1/webhooks/{id}/deliveries` | submit or approve | 200 the delivery log, newest first | – |
//!
//! On a dispatcher without the Postgres event log (`glia dev`, `glia serve`)
//! every one answers 404 `not_available`.
//!
//! **Signatures** follow Standard Webhooks (<https://www.standardwebhooks.com/>),
//! signed by [`glia_proto::webhook_signature`] (shared with the worker's HTTP
//! hooks): headers `webhook-id` (the delivery's `msg_id`, the same on every
//! retry), `webhook-timestamp` (Unix seconds of this attempt) and
//! `webhook-signature` = `v1,` + base64(HMAC-SHA256(key,
//! "{id}.{timestamp}.{body}")), where the key is the base64 part of the
//! `whsec_…` secret.
//!
//! **Retries**: a delivery that gets no 2xx is tried again after 1 s, 2 s,
//! 4 s, … up to [`DeliveryOptions::max_backoff`] (5 min), for
//! [`DeliveryOptions::max_attempts`] attempts (default 30: about two hours
//! of downtime), then marked `dead` (kept in the log). Redirects are not
//! followed.
//!
//! **Trust boundary**: the URL is tenant input. It must be `https` (or
//! `http`), and every address its host resolves to is checked at creation
//! and again before each attempt (the connection is pinned to the checked
//! address, so DNS cannot swap it afterwards): loopback, private, link-local,
//! unique-local, CGNAT, multicast and unspecified addresses are refused
//! unless the operator allows them ([`WebhookPolicy::allow_private`]) or
//! names the host ([`WebhookPolicy::allow_hosts`]). Secrets never appear in
//! logs, events or API answers after creation.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use chrono::Utc;
use glia_backends::webhooks::{
    Claimed, Delivery, EVENT_TYPES, Subscription, WebhookFormat, WebhookStore,
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use utoipa::ToSchema;
use uuid::Uuid;

use crate::app::App;
use crate::auth::{Principal, Scope};
use crate::error::{ApiError, ErrorBody};
use crate::extract::{ApiJson, ApiPath};

pub use crate::config::{WebhookConfig, WebhookPolicy};

/// Body of `POST /v1/webhooks`.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewSubscription {
    /// Receiver URL (`https://…`).
    pub url: String,
    /// Event types (default: all): `approval.requested`, `approval.escalated`,
    /// `approval.expired`, `approval.resolved`, `run.completed`, `run.failed`.
    #[serde(default)]
    pub events: Option<Vec<String>>,
    /// `standard` (default) or `slack`.
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    pub format: Option<WebhookFormat>,
}

/// A created subscription: the listing's fields plus the signing secret,
/// shown this once.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
pub struct Created {
    /// The subscription.
    #[serde(flatten)]
    #[schema(value_type = crate::docs::WebhookSubscriptionDoc)]
    pub subscription: Subscription,
    /// `whsec_…`: verify `webhook-signature` with it. Not shown again.
    pub secret: String,
}

/// Answer of `GET /v1/webhooks`.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
pub struct Subscriptions {
    /// Oldest first.
    #[schema(value_type = Vec<crate::docs::WebhookSubscriptionDoc>)]
    pub webhooks: Vec<Subscription>,
}

/// Answer of `GET /v1/webhooks/{id}/deliveries`.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
pub struct Deliveries {
    /// Newest first (at most 100).
    #[schema(value_type = Vec<crate::docs::WebhookDeliveryDoc>)]
    pub deliveries: Vec<Delivery>,
}

fn store(app: &App) -> Result<&Arc<dyn WebhookStore>, ApiError> {
    app.webhooks.store.as_ref().ok_or_else(|| {
        ApiError::NotAvailable(
            "webhooks are not available on this dispatcher (they need the Postgres event log)"
                .into(),
        )
    })
}

fn tenant_of(p: &Principal) -> Option<&str> {
    (!p.is_admin()).then_some(p.tenant.as_str())
}

/// A new signing secret: `whsec_` + base64 of 24 random bytes.
pub fn new_secret() -> String {
    let mut key = [0u8; 24];
    getrandom::fill(&mut key).expect("the OS random source works");
    format!("whsec_{}", B64.encode(key))
}

/// True for addresses a tenant's webhook may not reach without the operator's leave.
pub fn is_internal(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            v4.is_loopback() || v4.is_private() || v4.is_link_local() || v4.is_unspecified() || v4.is_multicast() || v4.is_broadcast()
                || (o[0] == 100 && (64..128).contains(&o[1])) // CGNAT 100.64/10
                || o[0] == 0
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_internal(IpAddr::V4(v4));
            }
            let s = v6.segments();
            v6.is_loopback() || v6.is_unspecified() || v6.is_multicast()
                || (s[0] & 0xfe00) == 0xfc00 // unique local fc00::/7
                || (s[0] & 0xffc0) == 0xfe80 // link local fe80::/10
        }
    }
}

/// Check a receiver URL against `policy`; returns the URL and the address to
/// connect to. Errors name the reason (never a secret).
pub async fn check_url(
    url: &str,
    policy: &WebhookPolicy,
) -> Result<(reqwest::Url, SocketAddr), String> {
    let parsed = reqwest::Url::parse(url).map_err(|e| format!("not a URL: {e}"))?;
    if !matches!(parsed.scheme(), "https" | "http") {
        return Err(format!("scheme {:?} is not http or https", parsed.scheme()));
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err(
            "credentials in the URL are not accepted; put them in the path or use the signature"
                .into(),
        );
    }
    let host = parsed
        .host_str()
        .ok_or("the URL has no host")?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let port = parsed
        .port_or_known_default()
        .ok_or("the URL has no port")?;
    let allowed_host = policy
        .allow_hosts
        .iter()
        .any(|h| h.eq_ignore_ascii_case(&host));
    let addrs: Vec<SocketAddr> = match host.parse::<IpAddr>() {
        Ok(ip) => vec![SocketAddr::new(ip, port)],
        Err(_) => tokio::net::lookup_host((host.as_str(), port))
            .await
            .map_err(|e| format!("host {host} does not resolve: {e}"))?
            .collect(),
    };
    let first = *addrs
        .first()
        .ok_or_else(|| format!("host {host} has no address"))?;
    if !policy.allow_private
        && !allowed_host
        && let Some(bad) = addrs.iter().find(|a| is_internal(a.ip()))
    {
        return Err(format!(
            "{host} resolves to {} (loopback, private or link-local), which webhooks may not reach unless the operator allows it",
            bad.ip()
        ));
    }
    Ok((parsed, first))
}

fn check_events(events: Option<Vec<String>>) -> Result<Vec<String>, ApiError> {
    let events = events.unwrap_or_else(|| EVENT_TYPES.iter().map(|s| s.to_string()).collect());
    if events.is_empty() {
        return Err(ApiError::Invalid("`events` is empty".into()));
    }
    if let Some(bad) = events.iter().find(|e| !EVENT_TYPES.contains(&e.as_str())) {
        return Err(ApiError::Invalid(format!(
            "unknown event type {bad:?} (expected one of {})",
            EVENT_TYPES.join(", ")
        )));
    }
    Ok(events)
}

/// Subscribe the caller's tenant to events at a URL. The answer carries the
/// signing secret, shown this once.
#[utoipa::path(post, path = "/v1/webhooks", tag = "webhooks", request_body = NewSubscription,
    responses((status = 201, body = Created), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 413, body = ErrorBody), (status = 415, body = ErrorBody), (status = 404, body = ErrorBody), (status = 422, body = ErrorBody), (status = 503, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn create(
    State(app): State<App>,
    p: Principal,
    ApiJson(body): ApiJson<NewSubscription>,
) -> Result<Response, ApiError> {
    p.require_any(&[Scope::Submit, Scope::Approve])?;
    let store = store(&app)?;
    let events = check_events(body.events)?;
    let (url, _) = check_url(&body.url, &app.webhooks.policy)
        .await
        .map_err(|e| ApiError::Invalid(format!("webhook url refused: {e}")))?;
    let secret = new_secret();
    let subscription = store
        .subscribe(
            &p.tenant,
            url.as_str(),
            &secret,
            &events,
            body.format.unwrap_or_default(),
        )
        .await?;
    tracing::info!(tenant = %p.tenant, id = %subscription.id, host = url.host_str().unwrap_or(""), "webhook subscription created");
    Ok((
        StatusCode::CREATED,
        Json(Created {
            subscription,
            secret,
        }),
    )
        .into_response())
}

/// The caller's tenant's subscriptions (an admin's: every tenant's); no secrets.
#[utoipa::path(get, path = "/v1/webhooks", tag = "webhooks",
    responses((status = 200, body = Subscriptions), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody), (status = 503, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list(State(app): State<App>, p: Principal) -> Result<Json<Subscriptions>, ApiError> {
    p.require_any(&[Scope::Submit, Scope::Approve])?;
    Ok(Json(Subscriptions {
        webhooks: store(&app)?.subscriptions(tenant_of(&p)).await?,
    }))
}

/// Remove a subscription; its pending deliveries are dropped.
#[utoipa::path(delete, path = "/v1/webhooks/{id}", tag = "webhooks", params(("id" = Uuid, Path, description = "Subscription id")),
    responses((status = 204), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody), (status = 503, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn delete(
    State(app): State<App>,
    p: Principal,
    ApiPath(id): ApiPath<Uuid>,
) -> Result<StatusCode, ApiError> {
    p.require_any(&[Scope::Submit, Scope::Approve])?;
    if store(&app)?.unsubscribe(tenant_of(&p), id).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::WebhookNotFound(id))
    }
}

/// A subscription's delivery log, newest first: status, attempts, last HTTP
/// status or error, next attempt. 404 `webhook_not_found` unless the
/// subscription is the caller's tenant's.
#[utoipa::path(get, path = "/v1/webhooks/{id}/deliveries", tag = "webhooks", params(("id" = Uuid, Path, description = "Subscription id")),
    responses((status = 200, body = Deliveries), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody), (status = 503, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn deliveries(
    State(app): State<App>,
    p: Principal,
    ApiPath(id): ApiPath<Uuid>,
) -> Result<Json<Deliveries>, ApiError> {
    p.require_any(&[Scope::Submit, Scope::Approve])?;
    let store = store(&app)?;
    // Another tenant's subscription and one that does not exist answer the same 404.
    if !store
        .subscriptions(tenant_of(&p))
        .await?
        .iter()
        .any(|s| s.id == id)
    {
        return Err(ApiError::WebhookNotFound(id));
    }
    Ok(Json(Deliveries {
        deliveries: store.deliveries(tenant_of(&p), id, 100).await?,
    }))
}

// ----- delivery --------------------------------------------------------------------------

/// Pacing of the deliverer.
#[derive(Debug, Clone)]
pub struct DeliveryOptions {
    /// Poll for due deliveries this often when idle (default 500 ms).
    pub poll: Duration,
    /// Deliveries claimed per pass (default 32).
    pub batch: usize,
    /// Time one attempt may take (default 10 s); also the claim's lease.
    pub timeout: Duration,
    /// First retry delay (default 1 s), doubled per attempt.
    pub base_backoff: Duration,
    /// Longest retry delay (default 5 min).
    pub max_backoff: Duration,
    /// Attempts before a delivery is `dead` (default 30).
    pub max_attempts: u32,
}

impl Default for DeliveryOptions {
    fn default() -> Self {
        DeliveryOptions {
            poll: Duration::from_millis(500),
            batch: 32,
            timeout: Duration::from_secs(10),
            base_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(300),
            max_attempts: 30,
        }
    }
}

/// The body a subscription receives for `d`.
pub fn body(d: &Delivery, format: WebhookFormat, public_url: Option<&str>) -> Value {
    match format {
        WebhookFormat::Standard => d.payload.clone(),
        WebhookFormat::Slack => {
            let data = &d.payload["data"];
            let s = |k: &str| data[k].as_str().unwrap_or("").to_owned();
            let base = public_url.unwrap_or("").trim_end_matches('/');
            let link = match data["call_id"].as_str() {
                Some(call) if d.event_type.starts_with("approval.") => {
                    format!("{base}/inbox/runs/{}/calls/{call}", d.run_id)
                }
                _ => format!("{base}/inbox/runs/{}", d.run_id),
            };
            let what = match d.event_type.as_str() {
                "approval.requested" => format!("Approval needed: `{}`", s("tool")),
                "approval.escalated" => format!("Approval overdue and escalated: `{}`", s("tool")),
                "approval.expired" => {
                    "Approval expired: nobody decided before the deadline".to_owned()
                }
                "approval.resolved" => format!("Approval {} by {}", s("decision"), s("decided_by")),
                "run.completed" => "Run completed".to_owned(),
                _ => format!("Run failed: {}", s("error")),
            };
            // Slack mrkdwn: escape &, <, > in text from the run.
            let esc = |t: &str| {
                t.replace('&', "&amp;")
                    .replace('<', "&lt;")
                    .replace('>', "&gt;")
            };
            let text = format!(
                "{} (run {}) <{}|Open in the inbox>",
                esc(&what),
                d.run_id,
                esc(&link)
            );
            json!({"text": text, "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": text}}]})
        }
    }
}

/// The delay before attempt `attempts + 1` after a failure.
pub fn backoff(attempts: u32, o: &DeliveryOptions) -> Duration {
    o.base_backoff
        .saturating_mul(2u32.saturating_pow(attempts.min(20)))
        .min(o.max_backoff)
}

/// One attempt: Ok(status) for a 2xx, Err((status, reason)) otherwise.
async fn attempt(
    c: &Claimed,
    public_url: Option<&str>,
    policy: &WebhookPolicy,
    timeout: Duration,
) -> Result<u16, (Option<u16>, String)> {
    let (url, addr) = check_url(&c.url, policy)
        .await
        .map_err(|e| (None, format!("url refused: {e}")))?;
    let body = serde_json::to_vec(&body(&c.delivery, c.format, public_url))
        .map_err(|e| (None, e.to_string()))?;
    let id = format!("msg_{}", c.delivery.msg_id.simple());
    let ts = Utc::now().timestamp();
    let signature = glia_proto::webhook_signature::sign(&c.secret, &id, ts, &body)
        .map_err(|e| (None, e.to_string()))?;
    let host = url.host_str().unwrap_or_default().to_owned();
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(timeout)
        .resolve(&host, addr)
        .user_agent("glia-webhooks/1")
        .build()
        .map_err(|e| (None, e.to_string()))?;
    let resp = client
        .post(url)
        .header("content-type", "application/json")
        .header("webhook-id", &id)
        .header("webhook-timestamp", ts.to_string())
        .header("webhook-signature", signature)
        .body(body)
        .send()
        .await
        .map_err(|e| (None, without_url(&e).to_string()))?;
    let status = resp.status().as_u16();
    if resp.status().is_success() {
        Ok(status)
    } else {
        Err((Some(status), format!("receiver answered {status}")))
    }
}

/// A reqwest error's text without the URL (it may carry a token in its path).
fn without_url(e: &reqwest::Error) -> String {
    let kind = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "could not connect"
    } else if e.is_request() {
        "request failed"
    } else {
        "failed"
    };
    kind.to_owned()
}

/// One pass: claim due deliveries and attempt each. Returns how many were attempted.
pub async fn deliver_once(
    app: &App,
    o: &DeliveryOptions,
) -> Result<usize, glia_backends::LogError> {
    let Some(store) = app.webhooks.store.clone() else {
        return Ok(0);
    };
    let claimed = store
        .claim(o.batch, o.timeout + Duration::from_secs(5))
        .await?;
    let n = claimed.len();
    let public_url = app.webhooks.public_url.clone();
    let attempts = claimed.into_iter().map(|c| {
        let store = store.clone();
        let public_url = public_url.clone();
        let policy = app.webhooks.policy.clone();
        async move {
            match attempt(&c, public_url.as_deref(), &policy, o.timeout).await {
                Ok(status) => store.delivered(c.delivery.id, status).await,
                Err((status, error)) => {
                    let tried = c.delivery.attempts + 1;
                    let retry_at = (tried < o.max_attempts).then(|| Utc::now() + chrono::Duration::from_std(backoff(c.delivery.attempts, o)).unwrap_or_default());
                    tracing::warn!(delivery = c.delivery.id, subscription = %c.delivery.subscription_id, attempt = tried, %error, dead = retry_at.is_none(), "webhook delivery failed");
                    store.failed(c.delivery.id, status, &error, retry_at).await
                }
            }
        }
    });
    for r in futures::future::join_all(attempts).await {
        r?;
    }
    Ok(n)
}

/// Deliver forever (spawn it next to the relay). Failures of the store are
/// logged and retried on the next poll.
pub async fn deliver(app: App, o: DeliveryOptions) {
    loop {
        match deliver_once(&app, &o).await {
            Ok(n) if n == o.batch => continue,
            Ok(_) => {}
            Err(e) => tracing::warn!("webhook deliverer: {e}"),
        }
        tokio::time::sleep(o.poll).await;
    }
}

impl crate::model::Documented for NewSubscription {
    const SCHEMA: &'static str = "NewSubscription";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_addresses() {
        for ip in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "::1",
            "fd00::1",
            "fe80::1",
            "::ffff:127.0.0.1",
        ] {
            assert!(is_internal(ip.parse().unwrap()), "{ip}");
        }
        for ip in ["93.184.216.34", "2606:2800:220:1:248:1893:25c8:1946"] {
            assert!(!is_internal(ip.parse().unwrap()), "{ip}");
        }
    }

    #[tokio::test]
    async fn urls_are_checked() {
        let strict = WebhookPolicy::default();
        assert!(
            check_url("http://127.0.0.1:9/x", &strict)
                .await
                .unwrap_err()
                .contains("loopback")
        );
        assert!(check_url("http://[::1]:9/x", &strict).await.is_err());
        assert!(
            check_url("ftp://example.com/", &strict)
                .await
                .unwrap_err()
                .contains("scheme")
        );
        assert!(
            check_url("https://u:p@example.com/", &strict)
                .await
                .unwrap_err()
                .contains("credentials")
        );
        let open = WebhookPolicy {
            allow_private: true,
            ..WebhookPolicy::default()
        };
        assert_eq!(
            check_url("http://127.0.0.1:9/x", &open).await.unwrap().1,
            "127.0.0.1:9".parse().unwrap()
        );
        let named = WebhookPolicy {
            allow_hosts: vec!["127.0.0.1".into()],
            ..WebhookPolicy::default()
        };
        assert!(check_url("http://127.0.0.1:9/x", &named).await.is_ok());
    }

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let o = DeliveryOptions::default();
        assert_eq!(backoff(0, &o), Duration::from_secs(1));
        assert_eq!(backoff(3, &o), Duration::from_secs(8));
        assert_eq!(backoff(25, &o), Duration::from_secs(300));
    }

    #[test]
    fn slack_messages_link_to_the_inbox_item() {
        let d = Delivery {
            id: 1,
            msg_id: Uuid::nil(),
            subscription_id: Uuid::nil(),
            event_type: "approval.requested".into(),
            run_id: Uuid::nil(),
            seq: 3,
            payload: json!({"type": "approval.requested", "data": {"call_id": "c1", "tool": "refund<b>"}}),
            status: "pending".into(),
            attempts: 0,
            next_attempt_at: Utc::now(),
            last_status: None,
            last_error: None,
            created_at: Utc::now(),
            delivered_at: None,
        };
        let b = body(&d, WebhookFormat::Slack, Some("https://glia.example.com/"));
        let text = b["text"].as_str().unwrap();
        assert!(text.contains("<https://glia.example.com/inbox/runs/00000000-0000-0000-0000-000000000000/calls/c1|Open in the inbox>"), "{text}");
        assert!(text.contains("refund&lt;b&gt;"), "{text}");
    }
}
