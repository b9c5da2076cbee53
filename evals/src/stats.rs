//! Statistics over an experiment's cells: per version the pass rate with
//! its 95% Wilson score interval, cost, latency and tokens; per case the
//! majority verdict of each version over its repetitions; the cases whose
//! verdict changes between versions; and the gate a CI job applies.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::grade::{RunFacts, Verdict};

/// One run of an experiment: a version × case × repetition, and how it was
/// graded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cell {
    /// The version's label.
    pub version: String,
    /// The case's id.
    pub case_id: String,
    /// The repetition's number (the caller's; reports show it as `case_id#rep`).
    pub rep: u32,
    /// The run, once started.
    pub run_id: Option<Uuid>,
    /// Where the cell stands (the run's status, or the caller's own word
    /// for a cell whose run is not started).
    pub status: String,
    /// The graders' verdicts, in the eval's order.
    pub verdicts: Vec<Verdict>,
    /// Whether the cell passed; `None` until graded.
    pub pass: Option<bool>,
    /// Set when the cell could not be run or graded: why.
    pub error: Option<String>,
    /// The run's facts, once it ended.
    pub facts: Option<RunFacts>,
}

/// One version's numbers. Percentiles are nearest-rank over the graded
/// cells that have facts (0 when none).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VersionStats {
    /// The version's label.
    pub version: String,
    /// Cells of the version.
    pub cells: u64,
    /// Cells graded.
    pub graded: u64,
    /// Cells passed.
    pub passed: u64,
    /// Graded cells with an error (the cell's own, or a grader's).
    pub errors: u64,
    /// `passed / graded`; 0 when nothing is graded.
    pub pass_rate: f64,
    /// 95% Wilson score interval of the pass rate, `(low, high)`; `(0, 1)`
    /// when nothing is graded.
    pub ci95: (f64, f64),
    /// Median cost of a run, USD micros.
    pub cost_usd_micros_p50: u64,
    /// 90th percentile cost of a run, USD micros.
    pub cost_usd_micros_p90: u64,
    /// Cost of the graded runs together, USD micros.
    pub cost_usd_micros_total: u64,
    /// Median latency of a run, ms.
    pub latency_ms_p50: u64,
    /// 90th percentile latency of a run, ms.
    pub latency_ms_p90: u64,
    /// Tokens of the graded runs together.
    pub tokens_total: u64,
}

/// A version's majority verdict on one case, over its graded repetitions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaseVerdict {
    /// Repetitions passed.
    pub passed: u32,
    /// Repetitions graded.
    pub total: u32,
    /// The majority: more than half passed (a tie fails).
    pub pass: bool,
}

/// One case across versions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaseRow {
    /// The case's id.
    pub case_id: String,
    /// Each version with at least one graded repetition of the case, by
    /// label.
    pub by_version: BTreeMap<String, CaseVerdict>,
}

/// A case whose majority verdict differs between two versions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Change {
    /// The case's id.
    pub case_id: String,
    /// The version compared with (the base).
    pub from_version: String,
    /// The version compared.
    pub to_version: String,
    /// The verdict under `from_version`.
    pub from_pass: bool,
    /// The verdict under `to_version`.
    pub to_pass: bool,
}

impl Change {
    /// True when the case passed under the base and fails under the other.
    pub fn is_regression(&self) -> bool {
        self.from_pass && !self.to_pass
    }
}

/// An experiment's numbers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Summary {
    /// One per version, in the experiment's order.
    pub versions: Vec<VersionStats>,
    /// One per case, cases whose verdict changes first, then in the order
    /// the cells give them.
    pub cases: Vec<CaseRow>,
    /// Each later version against the first, case by case.
    pub changes: Vec<Change>,
}

/// Sum up `cells` for `versions` (labels, the first the base).
pub fn summarize(versions: &[String], cells: &[Cell]) -> Summary {
    let stats = versions
        .iter()
        .map(|v| version_stats(v, cells.iter().filter(|c| &c.version == v)))
        .collect();
    let changes: Vec<Change> = match versions.split_first() {
        None => Vec::new(),
        Some((base, others)) => others
            .iter()
            .flat_map(|other| changes_between(base, other, cells))
            .collect(),
    };
    let mut cases: Vec<CaseRow> = majorities(cells)
        .into_iter()
        .map(|(case_id, by_version)| CaseRow {
            case_id: case_id.to_owned(),
            by_version: by_version
                .into_iter()
                .filter(|(v, _)| versions.contains(v))
                .collect(),
        })
        .collect();
    cases.sort_by_key(|row| !changes.iter().any(|c| c.case_id == row.case_id));
    Summary {
        versions: stats,
        cases,
        changes,
    }
}

/// The cases whose majority verdict under `other` differs from the one
/// under `base` (cases graded under both), in the order the cells give
/// them.
pub fn changes_between(base: &str, other: &str, cells: &[Cell]) -> Vec<Change> {
    majorities(cells)
        .into_iter()
        .filter_map(|(case_id, by_version)| {
            let (from, to) = (by_version.get(base)?, by_version.get(other)?);
            (from.pass != to.pass).then(|| Change {
                case_id: case_id.to_owned(),
                from_version: base.to_owned(),
                to_version: other.to_owned(),
                from_pass: from.pass,
                to_pass: to.pass,
            })
        })
        .collect()
}

/// What fails the gate, for people (empty: it passes): a `baseline` that is
/// not a version; each version (but the baseline) whose pass rate is below
/// `min_pass_rate` (0 to 1); each case that passes under the baseline and
/// fails under another version.
pub fn gate(summary: &Summary, min_pass_rate: Option<f64>, baseline: Option<&str>) -> Vec<String> {
    let mut failures = Vec::new();
    if let Some(base) = baseline
        && !summary.versions.iter().any(|v| v.version == base)
    {
        let known: Vec<&str> = summary
            .versions
            .iter()
            .map(|v| v.version.as_str())
            .collect();
        failures.push(format!(
            "baseline {base:?} is not a version of this experiment ({})",
            known.join(", ")
        ));
    }
    if let Some(min) = min_pass_rate {
        for v in &summary.versions {
            if Some(v.version.as_str()) != baseline && v.pass_rate < min {
                failures.push(format!(
                    "{}: pass rate {} is below {} ({} of {} graded cells passed)",
                    v.version,
                    percent(v.pass_rate),
                    percent(min),
                    v.passed,
                    v.graded
                ));
            }
        }
    }
    if let Some(base) = baseline {
        for row in &summary.cases {
            let Some(from) = row.by_version.get(base).filter(|b| b.pass) else {
                continue;
            };
            for v in &summary.versions {
                if let Some(to) = row.by_version.get(&v.version).filter(|t| !t.pass) {
                    failures.push(format!(
                        "case {:?} regressed under {}: passed under {base} ({}/{}), fails ({}/{})",
                        row.case_id, v.version, from.passed, from.total, to.passed, to.total
                    ));
                }
            }
        }
    }
    failures
}

/// `rate` as a percentage with one decimal (`83.3%`).
pub(crate) fn percent(rate: f64) -> String {
    format!("{:.1}%", rate * 100.0)
}

/// The 95% Wilson score interval (z = 1.96) of `passed` out of `total`,
/// `(low, high)`; `(0, 1)` when `total` is 0.
///
/// ```
/// let (low, high) = glia_evals::wilson(8, 10);
/// assert_eq!((format!("{low:.3}"), format!("{high:.3}")), ("0.490".into(), "0.943".into()));
/// ```
pub fn wilson(passed: u64, total: u64) -> (f64, f64) {
    if total == 0 {
        return (0.0, 1.0);
    }
    const Z: f64 = 1.96;
    let n = total as f64;
    let p = passed as f64 / n;
    let z2 = Z * Z;
    let denominator = 1.0 + z2 / n;
    let centre = (p + z2 / (2.0 * n)) / denominator;
    let half = Z * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt() / denominator;
    ((centre - half).max(0.0), (centre + half).min(1.0))
}

fn version_stats<'a>(version: &str, cells: impl Iterator<Item = &'a Cell>) -> VersionStats {
    let (mut count, mut graded, mut passed, mut errors) = (0, 0, 0, 0);
    let (mut costs, mut latencies, mut tokens_total) = (Vec::new(), Vec::new(), 0u64);
    for cell in cells {
        count += 1;
        let Some(pass) = cell.pass else { continue };
        graded += 1;
        passed += u64::from(pass);
        if cell.error.is_some() || cell.verdicts.iter().any(|v| v.error.is_some()) {
            errors += 1;
        }
        if let Some(facts) = &cell.facts {
            costs.push(facts.cost_usd_micros);
            latencies.push(facts.latency_ms);
            tokens_total = tokens_total.saturating_add(facts.tokens);
        }
    }
    costs.sort_unstable();
    latencies.sort_unstable();
    VersionStats {
        version: version.to_owned(),
        cells: count,
        graded,
        passed,
        errors,
        pass_rate: if graded == 0 {
            0.0
        } else {
            passed as f64 / graded as f64
        },
        ci95: wilson(passed, graded),
        cost_usd_micros_p50: nearest_rank(&costs, 50),
        cost_usd_micros_p90: nearest_rank(&costs, 90),
        cost_usd_micros_total: costs.iter().fold(0, |a, c| a.saturating_add(*c)),
        latency_ms_p50: nearest_rank(&latencies, 50),
        latency_ms_p90: nearest_rank(&latencies, 90),
        tokens_total,
    }
}

/// The `p`th percentile of `sorted` by nearest rank (the smallest value
/// with at least `p`% of values at or below it); 0 when empty.
fn nearest_rank(sorted: &[u64], p: usize) -> u64 {
    match sorted.len() {
        0 => 0,
        n => sorted[(p * n).div_ceil(100).clamp(1, n) - 1],
    }
}

/// Each case's majority verdict per version, over graded cells, cases in
/// the order the cells give them.
fn majorities(cells: &[Cell]) -> Vec<(&str, BTreeMap<String, CaseVerdict>)> {
    let mut rows: Vec<(&str, BTreeMap<String, CaseVerdict>)> = Vec::new();
    let mut index: BTreeMap<&str, usize> = BTreeMap::new();
    for cell in cells {
        let i = *index.entry(&cell.case_id).or_insert_with(|| {
            rows.push((&cell.case_id, BTreeMap::new()));
            rows.len() - 1
        });
        let Some(pass) = cell.pass else { continue };
        let verdict = rows[i]
            .1
            .entry(cell.version.clone())
            .or_insert(CaseVerdict {
                passed: 0,
                total: 0,
                pass: false,
            });
        verdict.total += 1;
        verdict.passed += u32::from(pass);
        verdict.pass = verdict.passed * 2 > verdict.total;
    }
    rows.retain(|(_, by_version)| !by_version.is_empty());
    rows
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A graded cell (`pass` None: not graded) with cost and latency.
    pub(crate) fn cell(
        version: &str,
        case_id: &str,
        rep: u32,
        pass: Option<bool>,
        cost: u64,
    ) -> Cell {
        let facts = crate::grade::RunFacts {
            outcome: "succeeded".into(),
            error: None,
            answer: "a".into(),
            output: None,
            tool_calls: Vec::new(),
            turns: 1,
            tool_call_count: 0,
            tokens: 10,
            cost_usd_micros: cost,
            latency_ms: cost * 10,
        };
        Cell {
            version: version.into(),
            case_id: case_id.into(),
            rep,
            run_id: Some(Uuid::nil()),
            status: "succeeded".into(),
            verdicts: Vec::new(),
            pass,
            error: None,
            facts: pass.map(|_| facts),
        }
    }

    fn versions() -> Vec<String> {
        vec!["v1".into(), "v2".into()]
    }

    #[test]
    fn wilson_interval_known_values() {
        let round =
            |(l, h): (f64, f64)| ((l * 1000.0).round() / 1000.0, (h * 1000.0).round() / 1000.0);
        assert_eq!(round(wilson(8, 10)), (0.49, 0.943));
        assert_eq!(round(wilson(10, 12)), (0.552, 0.953));
        assert_eq!(round(wilson(0, 10)), (0.0, 0.278));
        assert_eq!(round(wilson(10, 10)), (0.722, 1.0));
        assert_eq!(wilson(0, 0), (0.0, 1.0));
    }

    #[test]
    fn nearest_rank_percentiles() {
        assert_eq!(nearest_rank(&[], 50), 0);
        assert_eq!(nearest_rank(&[7], 90), 7);
        let ten: Vec<u64> = (1..=10).collect();
        assert_eq!((nearest_rank(&ten, 50), nearest_rank(&ten, 90)), (5, 9));
        assert_eq!(nearest_rank(&[1, 2, 3, 4], 50), 2);
        assert_eq!(nearest_rank(&[1, 2, 3], 90), 3);
    }

    #[test]
    fn versions_cases_and_changes() {
        let mut cells = vec![
            // c1 passes under v1, fails under v2 (a regression).
            cell("v1", "c1", 0, Some(true), 100),
            cell("v1", "c1", 1, Some(true), 300),
            cell("v1", "c1", 2, Some(false), 200),
            cell("v2", "c1", 0, Some(false), 50),
            cell("v2", "c1", 1, Some(true), 50),
            // c2 passes under both.
            cell("v1", "c2", 0, Some(true), 400),
            cell("v2", "c2", 0, Some(true), 50),
            // c3 fails under v1 (a tie fails), passes under v2.
            cell("v1", "c3", 0, Some(true), 500),
            cell("v1", "c3", 1, Some(false), 600),
            cell("v2", "c3", 0, Some(true), 50),
            // Not graded yet.
            cell("v2", "c4", 0, None, 0),
        ];
        cells[1].error = Some("x".into());
        let s = summarize(&versions(), &cells);
        let v1 = &s.versions[0];
        assert_eq!((v1.cells, v1.graded, v1.passed, v1.errors), (6, 6, 4, 1));
        assert!((v1.pass_rate - 4.0 / 6.0).abs() < 1e-12);
        assert_eq!(v1.ci95, wilson(4, 6));
        assert_eq!(
            (
                v1.cost_usd_micros_p50,
                v1.cost_usd_micros_p90,
                v1.cost_usd_micros_total
            ),
            (300, 600, 2100)
        );
        assert_eq!(
            (v1.latency_ms_p50, v1.latency_ms_p90, v1.tokens_total),
            (3000, 6000, 60)
        );
        let v2 = &s.versions[1];
        assert_eq!((v2.cells, v2.graded, v2.passed), (5, 4, 3));
        let order: Vec<&str> = s.cases.iter().map(|r| r.case_id.as_str()).collect();
        assert_eq!(
            order,
            ["c1", "c3", "c2"],
            "changed cases first; c4 has no verdict"
        );
        assert_eq!(
            s.cases[0].by_version["v1"],
            CaseVerdict {
                passed: 2,
                total: 3,
                pass: true
            }
        );
        assert_eq!(
            s.cases[0].by_version["v2"],
            CaseVerdict {
                passed: 1,
                total: 2,
                pass: false
            }
        );
        assert_eq!(
            s.changes,
            [
                Change {
                    case_id: "c1".into(),
                    from_version: "v1".into(),
                    to_version: "v2".into(),
                    from_pass: true,
                    to_pass: false
                },
                Change {
                    case_id: "c3".into(),
                    from_version: "v1".into(),
                    to_version: "v2".into(),
                    from_pass: false,
                    to_pass: true
                },
            ]
        );
        assert!(s.changes[0].is_regression() && !s.changes[1].is_regression());
        let back = changes_between("v2", "v1", &cells);
        assert_eq!(back.len(), 2);
        assert!(!back[0].is_regression() && back[1].is_regression());
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(serde_json::from_str::<Summary>(&json).unwrap(), s);

        let empty = summarize(&versions(), &[]);
        assert_eq!(
            (empty.versions[1].pass_rate, empty.versions[1].ci95),
            (0.0, (0.0, 1.0))
        );
        assert!(empty.cases.is_empty() && empty.changes.is_empty());
    }

    #[test]
    fn the_gate() {
        let cells = vec![
            cell("v1", "c1", 0, Some(true), 1),
            cell("v2", "c1", 0, Some(false), 1),
            cell("v1", "c2", 0, Some(false), 1),
            cell("v2", "c2", 0, Some(true), 1),
            cell("v1", "c3", 0, Some(true), 1),
            cell("v2", "c3", 0, Some(true), 1),
        ];
        let s = summarize(&versions(), &cells);
        assert!(gate(&s, None, None).is_empty());
        assert!(gate(&s, Some(0.6), None).is_empty(), "both at 66.7%");
        assert_eq!(gate(&s, Some(0.7), None).len(), 2);
        assert_eq!(
            gate(&s, Some(0.7), Some("v1")),
            [
                "v2: pass rate 66.7% is below 70.0% (2 of 3 graded cells passed)",
                r#"case "c1" regressed under v2: passed under v1 (1/1), fails (0/1)"#,
            ]
        );
        assert_eq!(
            gate(&s, Some(0.5), Some("v2")),
            [r#"case "c2" regressed under v1: passed under v2 (1/1), fails (0/1)"#]
        );
        assert_eq!(
            gate(&s, None, Some("v9")),
            [r#"baseline "v9" is not a version of this experiment (v1, v2)"#]
        );
    }
}
