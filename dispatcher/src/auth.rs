//! Bearer tokens: each configured token maps to a [`Principal`] (a tenant and
//! its [`Scope`]s). A run is visible only to its tenant; `admin` sees every
//! tenant. With no tokens configured ([`Auth::open`]) every request acts as an
//! admin of tenant [`OPEN_TENANT`], and the server must bind a loopback
//! address only (see [`crate::App::requires_loopback`] and [`crate::serve`]).
//!
//! Which endpoint needs which scope:
//!
//! | scope | endpoints |
//! |---|---|
//! | any valid token | `GET /v1/runs`, `GET /v1/runs/{id}`, events, stream, `GET /v1/schedules`, `GET /v1/schedules/{id}` |
//! | `submit` | `POST /v1/runs`, tool results, messages, close, cancel, resume; creating, changing, pausing, unpausing, backfilling and deleting schedules |
//! | `approve` | `GET /v1/approvals`, decisions (single and bulk), resume |
//! | `admin` | everything, across tenants |
//!
//! `/mcp` (the MCP server, [`crate::mcp`]) takes the same tokens: agents as
//! tools with `submit`, the approval tools with `approve`.
//!
//! `/healthz`, `/readyz`, `/metrics` and `/openapi.json` need no token.

use std::collections::HashMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::ApiError;

/// The tenant every request acts as when no tokens are configured.
pub const OPEN_TENANT: &str = "default";

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// Admit runs, post tool results and messages, cancel and resume.
    Submit,
    /// See the approval queue, decide approvals, resume.
    Approve,
    /// Register agent definitions (`PUT /v1/agents/{name}`) for its tenant.
    Agents,
    /// Erase the content of its tenant's finished runs (`DELETE
    /// /v1/runs/{id}`): a scope of its own, given to whoever answers
    /// erasure requests, not to every client that submits.
    Erase,
    /// Everything, across tenants.
    Admin,
}

impl Scope {
    /// `submit`, `approve`, `agents`, `erase` or `admin`.
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Submit => "submit",
            Scope::Approve => "approve",
            Scope::Agents => "agents",
            Scope::Erase => "erase",
            Scope::Admin => "admin",
        }
    }

    /// Parse `submit`, `approve`, `agents`, `erase` or `admin`.
    pub fn parse(s: &str) -> Result<Scope, AuthError> {
        match s.trim() {
            "submit" => Ok(Scope::Submit),
            "approve" => Ok(Scope::Approve),
            "agents" => Ok(Scope::Agents),
            "erase" => Ok(Scope::Erase),
            "admin" => Ok(Scope::Admin),
            other => Err(AuthError::UnknownScope(other.to_owned())),
        }
    }
}

/// Who a request acts as. JSON (in a token file):
/// `{"tenant": "acme", "scopes": ["submit", "approve"], "name": "ana"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Principal {
    /// The tenant; it owns the runs this principal admits.
    pub tenant: String,
    /// What it may do.
    pub scopes: Vec<Scope>,
    /// Shown as `by` on decisions and resumes; the tenant when absent.
    #[serde(default)]
    pub name: Option<String>,
}

impl Principal {
    /// True when it has `scope` (admin has every scope).
    pub fn has(&self, scope: Scope) -> bool {
        self.scopes.contains(&Scope::Admin) || self.scopes.contains(&scope)
    }

    /// True for an admin, who sees every tenant.
    pub fn is_admin(&self) -> bool {
        self.scopes.contains(&Scope::Admin)
    }

    /// `Ok` when it has `scope`, else [`ApiError::Forbidden`].
    pub fn require(&self, scope: Scope) -> Result<(), ApiError> {
        if self.has(scope) {
            Ok(())
        } else {
            Err(ApiError::Forbidden(scope.as_str().to_owned()))
        }
    }

    /// `Ok` when it has any of `scopes`, else [`ApiError::Forbidden`] naming the first.
    pub fn require_any(&self, scopes: &[Scope]) -> Result<(), ApiError> {
        if scopes.iter().any(|s| self.has(*s)) {
            Ok(())
        } else {
            Err(ApiError::Forbidden(
                scopes
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join("` or `"),
            ))
        }
    }

    /// True when it may see runs of `tenant`.
    pub fn sees(&self, tenant: &str) -> bool {
        self.is_admin() || self.tenant == tenant
    }

    /// Tenant filter for listings: `None` (all tenants) for admins.
    pub fn tenant_filter(&self) -> Option<String> {
        (!self.is_admin()).then(|| self.tenant.clone())
    }

    /// Name recorded as `by`.
    pub fn by(&self) -> String {
        self.name.clone().unwrap_or_else(|| self.tenant.clone())
    }
}

/// Why a token configuration is unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// A scope other than `submit`, `approve`, `agents`, `erase`, `admin`.
    #[error("unknown scope {0:?} (expected submit, approve, agents, erase or admin)")]
    UnknownScope(String),
    /// A token spec not of the form `TOKEN:TENANT:SCOPE[,SCOPE…]` (the spec
    /// itself is not echoed: it holds a secret).
    #[error(
        "bad token spec: expected TOKEN:TENANT:SCOPE[,SCOPE...], got {parts} ':'-separated part(s)"
    )]
    BadSpec {
        /// How many parts it had.
        parts: usize,
    },
    /// A token file that is not `{"TOKEN": {"tenant": …, "scopes": […]}}`.
    #[error("bad token file: {0}")]
    BadFile(String),
    /// An empty token, tenant, scope list or name.
    #[error("empty token, tenant, scope list or name")]
    Empty,
}

/// The configured tokens. Cheap to clone. Tokens are kept only as SHA-256
/// digests, and looked up by digest.
#[derive(Debug, Clone, Default)]
pub struct Auth {
    tokens: Arc<HashMap<[u8; 32], Principal>>,
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

impl Auth {
    /// No tokens: every request is an admin of [`OPEN_TENANT`]; loopback only.
    pub fn open() -> Auth {
        Auth::default()
    }

    /// These tokens. Errors: [`AuthError::Empty`] for an empty token, tenant or scope list.
    pub fn from_tokens(
        tokens: impl IntoIterator<Item = (String, Principal)>,
    ) -> Result<Auth, AuthError> {
        let mut map = HashMap::new();
        for (token, principal) in tokens {
            if token.is_empty() || principal.tenant.is_empty() || principal.scopes.is_empty() {
                return Err(AuthError::Empty);
            }
            map.insert(digest(&token), principal);
        }
        Ok(Auth {
            tokens: Arc::new(map),
        })
    }

    /// Parse one `TOKEN:TENANT:SCOPE[,SCOPE…][:NAME]` spec (e.g. from a
    /// repeated `--token` flag), e.g. `s3cret:acme:submit,approve` or, with
    /// the principal's name (recorded as the decider of its decisions;
    /// may itself hold `:`), `s3cret:acme:approve:ana@acme.example`. The
    /// three-part form keeps its meaning (the name is then the tenant).
    pub fn parse_spec(spec: &str) -> Result<(String, Principal), AuthError> {
        let mut parts = spec.splitn(4, ':');
        let (Some(token), Some(tenant), Some(scopes)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(AuthError::BadSpec {
                parts: spec.split(':').count(),
            });
        };
        let name = parts.next();
        if token.is_empty()
            || tenant.is_empty()
            || scopes.is_empty()
            || name.is_some_and(|n| n.trim().is_empty())
        {
            return Err(AuthError::Empty);
        }
        let scopes = scopes
            .split(',')
            .map(Scope::parse)
            .collect::<Result<Vec<_>, _>>()?;
        Ok((
            token.to_owned(),
            Principal {
                tenant: tenant.to_owned(),
                scopes,
                name: name.map(|n| n.trim().to_owned()),
            },
        ))
    }

    /// Who every request acts as without any credential: with no tokens
    /// configured (a dispatcher that then serves loopback only, and `glia
    /// dev` without `--token`), an admin of [`OPEN_TENANT`]; otherwise
    /// nobody. The one rule for the API ([`Auth::authenticate`]) and the
    /// console and inbox pages, which then open without sign-in.
    pub fn open_principal(&self) -> Option<Principal> {
        self.is_open().then(|| Principal {
            tenant: OPEN_TENANT.to_owned(),
            scopes: vec![Scope::Admin],
            name: None,
        })
    }

    /// The principal of a token by its SHA-256 digest (what an inbox session
    /// cookie carries instead of the token); `None` once the token is no
    /// longer configured. With no tokens configured: the open admin.
    pub fn by_digest(&self, digest: &[u8; 32]) -> Option<Principal> {
        self.open_principal()
            .or_else(|| self.tokens.get(digest).cloned())
    }

    /// The SHA-256 digest of `token` and its principal, if configured.
    pub fn lookup(&self, token: &str) -> Option<([u8; 32], Principal)> {
        let d = digest(token.trim());
        self.by_digest(&d).map(|p| (d, p))
    }

    /// Parse a token file: `{"TOKEN": {"tenant": "acme", "scopes": ["submit"], "name": "ci"}, …}`.
    pub fn from_json(json: &str) -> Result<Auth, AuthError> {
        let map: HashMap<String, Principal> =
            serde_json::from_str(json).map_err(|e| AuthError::BadFile(e.to_string()))?;
        Auth::from_tokens(map)
    }

    /// True when no tokens are configured.
    pub fn is_open(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Number of configured tokens.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// True when no tokens are configured (same as [`Auth::is_open`]).
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The principal for an `Authorization` header value. Errors:
    /// [`ApiError::MissingToken`] (absent, or not `Bearer …`),
    /// [`ApiError::InvalidToken`] (not configured).
    pub fn authenticate(&self, authorization: Option<&str>) -> Result<Principal, ApiError> {
        if let Some(open) = self.open_principal() {
            return Ok(open);
        }
        let value = authorization.ok_or(ApiError::MissingToken)?.trim();
        let (scheme, token) = value.split_once(' ').ok_or(ApiError::MissingToken)?;
        if !scheme.eq_ignore_ascii_case("bearer") {
            return Err(ApiError::MissingToken);
        }
        self.tokens
            .get(&digest(token.trim()))
            .cloned()
            .ok_or(ApiError::InvalidToken)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_specs_and_files() {
        let (token, p) = Auth::parse_spec("s3cret:acme:submit,approve").unwrap();
        assert_eq!(
            (token.as_str(), p.tenant.as_str(), p.scopes.as_slice()),
            ("s3cret", "acme", &[Scope::Submit, Scope::Approve][..])
        );
        assert_eq!(
            Auth::parse_spec("s3cret:acme:root"),
            Err(AuthError::UnknownScope("root".into()))
        );
        let err = Auth::parse_spec("s3cret:acme").unwrap_err();
        assert_eq!(err, AuthError::BadSpec { parts: 2 });
        assert!(
            !err.to_string().contains("s3cret"),
            "the token is not echoed"
        );
        assert_eq!(Auth::parse_spec("::submit"), Err(AuthError::Empty));
        let (_, named) = Auth::parse_spec("s3cret:acme:approve:ana@acme.example").unwrap();
        assert_eq!(
            (named.tenant.as_str(), named.by()),
            ("acme", "ana@acme.example".to_owned())
        );
        assert_eq!(
            Auth::parse_spec("s3cret:acme:approve: "),
            Err(AuthError::Empty)
        );
        let auth =
            Auth::from_json(r#"{"t1": {"tenant": "acme", "scopes": ["admin"], "name": "ops"}}"#)
                .unwrap();
        assert_eq!(auth.len(), 1);
        let p = auth.authenticate(Some("Bearer t1")).unwrap();
        assert!(p.is_admin() && p.has(Scope::Submit) && p.sees("anyone"));
        assert_eq!(p.by(), "ops");
        assert!(matches!(Auth::from_json("[]"), Err(AuthError::BadFile(_))));
        assert!(matches!(
            Auth::from_json(r#"{"t": {"tenant": "a", "scopes": []}}"#),
            Err(AuthError::Empty)
        ));
    }

    #[test]
    fn scopes_and_tenants() {
        let p = Principal {
            tenant: "a".into(),
            scopes: vec![Scope::Submit],
            name: None,
        };
        assert!(p.require(Scope::Submit).is_ok());
        assert_eq!(
            p.require(Scope::Approve),
            Err(ApiError::Forbidden("approve".into()))
        );
        assert!(p.require_any(&[Scope::Approve, Scope::Submit]).is_ok());
        assert!(p.sees("a") && !p.sees("b"));
        assert_eq!(p.tenant_filter(), Some("a".into()));
        assert!(Auth::open().authenticate(None).unwrap().is_admin());
    }
}
