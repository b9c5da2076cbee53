//! `/console/experiments` (issue 31, evals): the tenant's experiments (an
//! admin's: every tenant's), and one experiment's table: per version the
//! pass rate with its 95% interval, errors, cost, latency and tokens; then
//! one row per case (those whose verdict changed against the first version
//! first), one column per version with its majority verdict, each cell
//! linking to its runs and, when it failed, saying why.

use std::collections::{BTreeMap, HashMap};

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::get;
use chrono::{DateTime, Utc};
use glia_evals::stats::{Cell, Summary, VersionStats};
use minijinja::context;
use serde::Serialize;
use uuid::Uuid;

use super::batches::usd;
use crate::app::App;
use crate::auth::Principal;
use crate::batches::tenant_of;
use crate::error::ApiError;
use crate::evals::{store, view, view_results};
use crate::inbox::{api_error_page, error_page, html, human, session, to_login};
use crate::model::evals::ExperimentView;

/// Experiments per page of the list.
const LIST_PAGE: usize = 50;
/// Case rows an experiment's page shows (changed cases first; the API has
/// every cell).
const SHOW_CASES: usize = 500;
/// Characters of a failed cell's reasons shown under its verdict (the
/// tooltip has them all).
const REASON_LINE: usize = 160;

pub(super) fn routes() -> Router<App> {
    Router::new()
        .route("/console/experiments", get(list))
        .route("/console/experiments/{id}", get(one))
}

/// An experiment as the pages show it.
#[derive(Debug, Serialize)]
struct Row {
    id: Uuid,
    name: String,
    state: &'static str,
    dataset: String,
    /// Version labels, the first the base.
    versions: Vec<String>,
    repetitions: u32,
    cells: u64,
    graded: u64,
    created_at: DateTime<Utc>,
    finished_at: Option<DateTime<Utc>>,
}

fn row(v: &ExperimentView) -> Row {
    Row {
        id: v.id,
        name: v.name.clone(),
        state: v.state.as_str(),
        dataset: v.dataset.clone(),
        versions: v.versions.iter().map(|x| x.label.clone()).collect(),
        repetitions: v.repetitions,
        cells: v.progress.cells,
        graded: v.progress.graded,
        created_at: v.created_at,
        finished_at: v.finished_at,
    }
}

async fn list(
    State(app): State<App>,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let (s, before) = match super::paging::list_start(&app, &headers, &q, "before", "an experiment")
    {
        Ok(found) => found,
        Err(r) => return r,
    };
    match page(&app, &s.principal, before).await {
        Ok((rows, next)) => html(
            StatusCode::OK,
            "console_experiments.html",
            context! { rows, next, ..s.frame() },
        ),
        Err(e) => api_error_page(&s, e),
    }
}

/// A page of `p`'s experiments older than `before`, and the next page's
/// cursor.
async fn page(
    app: &App,
    p: &Principal,
    before: Option<Uuid>,
) -> Result<(Vec<Row>, Option<Uuid>), ApiError> {
    let found = store(app)?
        .experiments(tenant_of(p), before, LIST_PAGE)
        .await?;
    let mut rows = Vec::with_capacity(found.len());
    for exp in &found {
        rows.push(row(&view(app, exp, false).await?));
    }
    Ok((
        rows,
        super::paging::next_cursor(&found, LIST_PAGE, |x| x.id),
    ))
}

/// One version's numbers as the page shows them.
#[derive(Debug, Serialize)]
struct VersionLine {
    label: String,
    batch_id: Option<Uuid>,
    cells: u64,
    graded: u64,
    passed: u64,
    errors: u64,
    /// `83.3%`, or `–` with nothing graded.
    pass_rate: String,
    /// `[49.0%, 94.3%]`.
    ci95: String,
    cost_p50: String,
    cost_p90: String,
    cost_total: String,
    latency_p50: String,
    latency_p90: String,
    tokens: u64,
}

fn percent(rate: f64) -> String {
    format!("{:.1}%", rate * 100.0)
}

fn version_line(v: &VersionStats, batch_id: Option<Uuid>) -> VersionLine {
    let graded = v.graded > 0;
    VersionLine {
        label: v.version.clone(),
        batch_id,
        cells: v.cells,
        graded: v.graded,
        passed: v.passed,
        errors: v.errors,
        pass_rate: if graded {
            percent(v.pass_rate)
        } else {
            "–".into()
        },
        ci95: if graded {
            format!("[{}, {}]", percent(v.ci95.0), percent(v.ci95.1))
        } else {
            "–".into()
        },
        cost_p50: usd(v.cost_usd_micros_p50),
        cost_p90: usd(v.cost_usd_micros_p90),
        cost_total: usd(v.cost_usd_micros_total),
        latency_p50: human(v.latency_ms_p50 as i64),
        latency_p90: human(v.latency_ms_p90 as i64),
        tokens: v.tokens_total,
    }
}

/// One repetition of a case under a version: a link to its run.
#[derive(Debug, Serialize)]
struct Rep {
    rep: u32,
    run_id: Option<Uuid>,
    status: String,
    /// `None` until graded.
    pass: Option<bool>,
}

/// A case under one version.
#[derive(Debug, Serialize)]
struct CaseCell {
    /// The majority verdict over the graded repetitions (a tie fails).
    graded: bool,
    pass: bool,
    passed: u32,
    total: u32,
    /// Against the first version: `regressed` or `fixed`.
    change: Option<&'static str>,
    /// Repetitions not graded yet: their statuses (`running`,
    /// `parked:awaiting_input`), counted.
    pending: Vec<(String, u32)>,
    reps: Vec<Rep>,
    /// Why the failed repetitions failed, each reason once, after the
    /// repetitions that gave it (`#0 #1 contains: …`; no numbers with one
    /// repetition).
    reasons: Vec<String>,
    /// The first reason, cut to [`REASON_LINE`] characters.
    reason_line: Option<String>,
}

/// A case across versions.
#[derive(Debug, Serialize)]
struct CaseLine {
    case_id: String,
    changed: bool,
    /// One per version, in the experiment's order.
    cells: Vec<CaseCell>,
}

/// Why a failed cell failed: its own error, then each verdict that did not
/// pass (`grader: reason` or `grader: error`).
fn why(cell: &Cell) -> Vec<String> {
    let mut out: Vec<String> = cell.error.iter().cloned().collect();
    for v in cell.verdicts.iter().filter(|v| !v.pass) {
        let text = match (&v.error, v.reason.is_empty()) {
            (Some(e), _) => format!("{}: grading error: {e}", v.grader),
            (None, false) => format!("{}: {}", v.grader, v.reason),
            (None, true) => format!("{}: failed", v.grader),
        };
        let text = if v.required {
            text
        } else {
            format!("{text} (not required)")
        };
        if !out.contains(&text) {
            out.push(text);
        }
    }
    out
}

/// `text` cut to `max` characters, with `…` when cut.
fn cut(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        None => text.to_owned(),
        Some((i, _)) => format!("{}…", &text[..i]),
    }
}

/// The cases × versions table: a row per case, those in `summary.cases`
/// first in its order (the changed ones first), then the cases no version
/// has graded yet, in the cells' order.
fn case_lines(labels: &[String], cells: &[Cell], summary: &Summary) -> Vec<CaseLine> {
    let mut order: Vec<&str> = summary.cases.iter().map(|r| r.case_id.as_str()).collect();
    let mut by_case: HashMap<&str, Vec<&Cell>> = HashMap::new();
    for c in cells {
        let of = by_case.entry(c.case_id.as_str()).or_default();
        if of.is_empty() && !summary.cases.iter().any(|r| r.case_id == c.case_id) {
            order.push(&c.case_id);
        }
        of.push(c);
    }
    order
        .into_iter()
        .map(|case_id| {
            let row = summary.cases.iter().find(|r| r.case_id == case_id);
            let of = by_case.get(case_id).map(Vec::as_slice).unwrap_or_default();
            let line_cells = labels
                .iter()
                .map(|label| {
                    let verdict = row.and_then(|r| r.by_version.get(label));
                    let change = summary
                        .changes
                        .iter()
                        .find(|c| c.case_id == case_id && &c.to_version == label)
                        .map(|c| {
                            if c.is_regression() {
                                "regressed"
                            } else {
                                "fixed"
                            }
                        });
                    let mut pending: BTreeMap<String, u32> = BTreeMap::new();
                    let mut reps = Vec::new();
                    // Each reason once, with the repetitions that gave it.
                    let mut failed: Vec<(String, Vec<u32>)> = Vec::new();
                    let mine: Vec<&&Cell> = of.iter().filter(|c| &c.version == label).collect();
                    for c in &mine {
                        if c.pass.is_none() {
                            *pending.entry(c.status.clone()).or_default() += 1;
                        }
                        if c.pass == Some(false) {
                            for r in why(c) {
                                match failed.iter_mut().find(|(text, _)| *text == r) {
                                    Some((_, at)) => at.push(c.rep),
                                    None => failed.push((r, vec![c.rep])),
                                }
                            }
                        }
                        reps.push(Rep {
                            rep: c.rep,
                            run_id: c.run_id,
                            status: c.status.clone(),
                            pass: c.pass,
                        });
                    }
                    reps.sort_by_key(|r| r.rep);
                    let reasons: Vec<String> = failed
                        .into_iter()
                        .map(|(text, at)| match mine.len() {
                            1 => text,
                            _ => {
                                let at: Vec<String> = at.iter().map(|r| format!("#{r}")).collect();
                                format!("{} {text}", at.join(" "))
                            }
                        })
                        .collect();
                    CaseCell {
                        graded: verdict.is_some(),
                        pass: verdict.is_some_and(|v| v.pass),
                        passed: verdict.map_or(0, |v| v.passed),
                        total: verdict.map_or(0, |v| v.total),
                        change,
                        pending: pending.into_iter().collect(),
                        reps,
                        reason_line: reasons.first().map(|r| cut(r, REASON_LINE)),
                        reasons,
                    }
                })
                .collect();
            CaseLine {
                case_id: case_id.to_owned(),
                changed: summary.changes.iter().any(|c| c.case_id == case_id),
                cells: line_cells,
            }
        })
        .collect()
}

async fn one(State(app): State<App>, headers: HeaderMap, Path(id): Path<String>) -> Response {
    let Some(s) = session(&app, &headers) else {
        return to_login();
    };
    let Ok(id) = id.parse::<Uuid>() else {
        return error_page(Some(&s), StatusCode::NOT_FOUND, "no such experiment");
    };
    let store = match store(&app) {
        Ok(st) => st,
        Err(e) => return api_error_page(&s, e),
    };
    // Another tenant's experiment is not found, like a missing one.
    let exp = match store.experiment(tenant_of(&s.principal), id).await {
        Ok(Some(exp)) => exp,
        Ok(None) => return api_error_page(&s, ApiError::ExperimentNotFound(id)),
        Err(e) => return api_error_page(&s, e.into()),
    };
    let (v, cells, summary) = match view_results(&app, &exp).await {
        Ok(found) => found,
        Err(e) => return api_error_page(&s, e),
    };
    let labels: Vec<String> = v.versions.iter().map(|x| x.label.clone()).collect();
    let versions: Vec<VersionLine> = summary
        .versions
        .iter()
        .zip(&v.versions)
        .map(|(stats, x)| version_line(stats, x.batch_id))
        .collect();
    let mut cases = case_lines(&labels, &cells, &summary);
    let total_cases = cases.len();
    cases.truncate(SHOW_CASES);
    let regressions = summary.changes.iter().filter(|c| c.is_regression()).count();
    let fixes = summary.changes.len() - regressions;
    html(
        StatusCode::OK,
        "console_experiment.html",
        context! { e => row(&v), versions, cases, total_cases, show => SHOW_CASES,
        regressions, fixes, base => labels.first(), ..s.frame() },
    )
}

#[cfg(test)]
mod tests {
    use glia_evals::grade::Verdict;
    use glia_evals::stats::{Cell, summarize};

    fn cell(version: &str, case: &str, rep: u32, pass: Option<bool>) -> Cell {
        Cell {
            version: version.into(),
            case_id: case.into(),
            rep,
            run_id: None,
            status: if pass.is_some() {
                "succeeded"
            } else {
                "running"
            }
            .into(),
            verdicts: Vec::new(),
            pass,
            error: None,
            facts: None,
        }
    }

    #[test]
    fn changed_cases_first_then_ungraded_ones_with_reasons() {
        let labels = vec!["v1".to_owned(), "v2".to_owned()];
        let mut failed = cell("v2", "b", 1, Some(false));
        failed.verdicts = vec![Verdict {
            grader: "contains".into(),
            score: 0.0,
            pass: false,
            required: true,
            reason: "the answer lacks \"42\"".into(),
            error: None,
        }];
        let cells = vec![
            cell("v1", "a", 0, Some(true)),
            cell("v2", "a", 0, Some(true)),
            cell("v1", "b", 0, Some(true)),
            cell("v1", "b", 1, Some(true)),
            cell("v2", "b", 0, Some(false)),
            failed,
            cell("v1", "c", 0, None),
            cell("v2", "c", 0, None),
        ];
        let summary = summarize(&labels, &cells);
        let lines = super::case_lines(&labels, &cells, &summary);
        let ids: Vec<&str> = lines.iter().map(|l| l.case_id.as_str()).collect();
        assert_eq!(ids, ["b", "a", "c"]);
        let b = &lines[0];
        assert!(b.changed);
        assert_eq!(b.cells[1].change, Some("regressed"));
        assert_eq!((b.cells[1].passed, b.cells[1].total), (0, 2));
        assert_eq!(b.cells[1].reasons, ["#1 contains: the answer lacks \"42\""]);
        assert_eq!(lines[1].cells[0].reasons, Vec::<String>::new());
        assert_eq!(b.cells[1].reps.len(), 2);
        let c = &lines[2];
        assert!(!c.cells[0].graded);
        assert_eq!(c.cells[0].pending, [("running".to_owned(), 1)]);
    }

    #[test]
    fn cut_marks_what_it_cuts() {
        assert_eq!(super::cut("abc", 3), "abc");
        assert_eq!(super::cut("abcd", 3), "abc…");
        assert_eq!(super::cut("éééé", 2), "éé…");
    }
}
