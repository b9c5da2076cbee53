//! `/console/agents`: the tenant's agents with their versions, one agent's
//! versions with each definition readable, and a line diff of two
//! versions' definitions (`similar`, escaped like every page).

use std::collections::HashMap;

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::get;
use chrono::{DateTime, Utc};
use glia_backends::AgentVersion;
use minijinja::context;
use serde::Serialize;
use similar::{ChangeTag, TextDiff};

use crate::app::App;
use crate::inbox::{Session, error_page, html, log_error_page, session, to_login};

/// Versions an agent's page shows (newest first); older ones are reached
/// by the diff's version numbers.
const SHOW_VERSIONS: u32 = 50;
/// Lines of unchanged context around each change of a diff.
const CONTEXT_LINES: usize = 3;

pub(super) fn routes() -> Router<App> {
    Router::new()
        .route("/console/agents", get(list))
        .route("/console/agents/{name}", get(one))
        .route("/console/agents/{name}/diff", get(diff))
}

/// One version as the pages show it.
#[derive(Debug, Serialize)]
struct Version {
    version: u32,
    content_hash: String,
    created_at: DateTime<Utc>,
    model: Option<String>,
    /// The definition, pretty-printed JSON.
    text: String,
}

/// The definition of `v` as readable text: its stored canonical JSON,
/// pretty-printed (keys in order, two-space indent); the stored text as it
/// is if it does not parse.
fn readable(v: &AgentVersion) -> String {
    serde_json::from_str::<serde_json::Value>(&v.definition)
        .ok()
        .and_then(|j| serde_json::to_string_pretty(&j).ok())
        .unwrap_or_else(|| v.definition.clone())
}

fn version(v: &AgentVersion) -> Version {
    let model = serde_json::from_str::<serde_json::Value>(&v.definition)
        .ok()
        .and_then(|j| {
            j.pointer("/config/model")
                .or_else(|| j.get("model"))
                .and_then(|m| m.as_str().map(str::to_owned))
        });
    Version {
        version: v.version,
        content_hash: v.content_hash.clone(),
        created_at: v.created_at,
        model,
        text: readable(v),
    }
}

/// Versions `from..=to` of agent `name` of `s`'s tenant, newest first.
async fn versions(
    app: &App,
    s: &Session,
    name: &str,
    from: u32,
    to: u32,
) -> Result<Vec<AgentVersion>, Response> {
    let mut out = Vec::new();
    for n in (from..=to).rev() {
        match app.log.get_agent(&s.principal.tenant, name, Some(n)).await {
            Ok(Some(v)) => out.push(v),
            Ok(None) => {}
            Err(e) => return Err(log_error_page(s, e)),
        }
    }
    Ok(out)
}

/// The latest version of agent `name` of `s`'s tenant; another tenant's
/// agent, like a missing one, is a 404 page.
async fn latest(app: &App, s: &Session, name: &str) -> Result<AgentVersion, Response> {
    match app.log.get_agent(&s.principal.tenant, name, None).await {
        Ok(Some(v)) => Ok(v),
        Ok(None) => Err(not_found(s, name)),
        Err(e) => Err(log_error_page(s, e)),
    }
}

fn not_found(s: &Session, name: &str) -> Response {
    error_page(
        Some(s),
        StatusCode::NOT_FOUND,
        &format!("agent {name} not found"),
    )
}

async fn list(State(app): State<App>, headers: HeaderMap) -> Response {
    let Some(s) = session(&app, &headers) else {
        return to_login();
    };
    let agents = match app.log.list_agents(&s.principal.tenant).await {
        Ok(a) => a,
        Err(e) => return log_error_page(&s, e),
    };
    let rows: Vec<_> = agents
        .iter()
        .map(|a| {
            let latest = version(a);
            let shown = a.version.min(SHOW_VERSIONS);
            let versions: Vec<u32> = (a.version + 1 - shown..=a.version).rev().collect();
            context! { name => a.name.clone(), latest, versions }
        })
        .collect();
    html(
        StatusCode::OK,
        "console_agents.html",
        context! { rows, ..s.frame() },
    )
}

async fn one(State(app): State<App>, headers: HeaderMap, Path(name): Path<String>) -> Response {
    let Some(s) = session(&app, &headers) else {
        return to_login();
    };
    let latest = match latest(&app, &s, &name).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    let oldest = latest.version.saturating_sub(SHOW_VERSIONS - 1).max(1);
    let shown = match versions(&app, &s, &name, oldest, latest.version).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    let shown: Vec<Version> = shown.iter().map(version).collect();
    html(
        StatusCode::OK,
        "console_agent.html",
        context! { name, latest => latest.version, versions => shown, older => oldest > 1, ..s.frame() },
    )
}

/// One line of a diff: `+`, `-` or ` `, its text, and whether a gap of
/// unchanged lines comes before it.
#[derive(Debug, Serialize)]
struct DiffLine {
    tag: &'static str,
    text: String,
    gap: bool,
}

/// The line diff of `old` to `new`: each change with [`CONTEXT_LINES`] of
/// context, a gap marked where unchanged lines are left out.
fn line_diff(old: &str, new: &str) -> Vec<DiffLine> {
    let diff = TextDiff::from_lines(old, new);
    let mut out = Vec::new();
    for (i, group) in diff.grouped_ops(CONTEXT_LINES).iter().enumerate() {
        let mut first = true;
        for op in group {
            for change in diff.iter_changes(op) {
                out.push(DiffLine {
                    tag: match change.tag() {
                        ChangeTag::Delete => "-",
                        ChangeTag::Insert => "+",
                        ChangeTag::Equal => " ",
                    },
                    text: change.value().trim_end_matches('\n').to_owned(),
                    gap: first && i > 0,
                });
                first = false;
            }
        }
    }
    out
}

/// A version number of the query, or the page saying which and why.
fn version_param(q: &HashMap<String, String>, key: &str) -> Result<u32, String> {
    let raw = q
        .get(key)
        .map(|v| v.trim())
        .filter(|v| !v.is_empty())
        .ok_or_else(|| format!("{key}: missing; give two versions, e.g. ?from=1&to=2"))?;
    raw.parse::<u32>()
        .ok()
        .filter(|n| *n >= 1)
        .ok_or_else(|| format!("{key}: {raw:?} is not a version number (1, 2, …)"))
}

async fn diff(
    State(app): State<App>,
    headers: HeaderMap,
    Path(name): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let Some(s) = session(&app, &headers) else {
        return to_login();
    };
    let (from, to) = match (version_param(&q, "from"), version_param(&q, "to")) {
        (Ok(f), Ok(t)) => (f, t),
        (Err(m), _) | (_, Err(m)) => return error_page(Some(&s), StatusCode::BAD_REQUEST, &m),
    };
    let latest = match latest(&app, &s, &name).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    let mut pair = Vec::with_capacity(2);
    for n in [from, to] {
        match app.log.get_agent(&s.principal.tenant, &name, Some(n)).await {
            Ok(Some(v)) => pair.push(v),
            Ok(None) => {
                return error_page(
                    Some(&s),
                    StatusCode::NOT_FOUND,
                    &format!(
                        "agent {name} has no version {n} (its latest is {})",
                        latest.version
                    ),
                );
            }
            Err(e) => return log_error_page(&s, e),
        }
    }
    let (old, new) = (readable(&pair[0]), readable(&pair[1]));
    let lines = line_diff(&old, &new);
    let changed = lines.iter().filter(|l| l.tag != " ").count();
    html(
        StatusCode::OK,
        "console_diff.html",
        context! { name, from, to, latest => latest.version, lines, changed,
        from_v => version(&pair[0]), to_v => version(&pair[1]), ..s.frame() },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_diff_shows_the_changed_line_with_context_and_gaps() {
        let old: String = (1..=20).map(|i| format!("line {i}\n")).collect();
        let new = old
            .replace("line 3\n", "line three\n")
            .replace("line 18\n", "");
        let d = line_diff(&old, &new);
        let tags: Vec<(&str, &str)> = d.iter().map(|l| (l.tag, l.text.as_str())).collect();
        assert!(tags.contains(&("-", "line 3")) && tags.contains(&("+", "line three")));
        assert!(tags.contains(&("-", "line 18")));
        assert!(
            !tags.iter().any(|(_, t)| *t == "line 10"),
            "far from any change: left out"
        );
        assert_eq!(
            d.iter().filter(|l| l.gap).count(),
            1,
            "one gap between the two hunks"
        );
        assert!(line_diff("same\n", "same\n").is_empty());
    }
}
