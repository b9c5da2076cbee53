//! Reports: JUnit XML for CI systems, Markdown for people.

use quick_xml::Writer;
use quick_xml::events::{BytesDecl, BytesText, Event};

use crate::stats::{Cell, Summary, percent};

/// The cells as JUnit XML: `<testsuites name>`, a `<testsuite>` per version
/// (in the order the cells give them) with `tests`, `failures`, `errors`
/// and `skipped` counts, and a `<testcase classname="{version}"
/// name="{case_id}#{rep}" time="{latency in seconds}">` per cell holding
/// `<error message>` (the run did not succeed, or a cell or grader error),
/// `<failure message>` (the reasons of the failed required verdicts) or
/// `<skipped/>` (not graded yet), and the run's id as `<system-out>`.
pub fn junit(name: &str, cells: &[Cell]) -> String {
    let mut versions: Vec<&str> = Vec::new();
    for cell in cells {
        if !versions.contains(&cell.version.as_str()) {
            versions.push(&cell.version);
        }
    }
    let mut writer = Writer::new_with_indent(Vec::new(), b' ', 2);
    let written: std::io::Result<()> = (|| {
        writer.write_event(Event::Decl(BytesDecl::new("1.0", Some("UTF-8"), None)))?;
        writer
            .create_element("testsuites")
            .with_attribute(("name", xml_text(name).as_str()))
            .write_inner_content(|w| {
                for version in &versions {
                    let suite: Vec<(&Cell, Outcome)> = cells
                        .iter()
                        .filter(|c| c.version == *version)
                        .map(|c| (c, outcome(c)))
                        .collect();
                    let count = |f: fn(&Outcome) -> bool| {
                        suite.iter().filter(|(_, o)| f(o)).count().to_string()
                    };
                    w.create_element("testsuite")
                        .with_attribute(("name", xml_text(version).as_str()))
                        .with_attribute(("tests", suite.len().to_string().as_str()))
                        .with_attribute((
                            "failures",
                            count(|o| matches!(o, Outcome::Failure(_))).as_str(),
                        ))
                        .with_attribute((
                            "errors",
                            count(|o| matches!(o, Outcome::Error(_))).as_str(),
                        ))
                        .with_attribute((
                            "skipped",
                            count(|o| matches!(o, Outcome::Skipped)).as_str(),
                        ))
                        .write_inner_content(|w| {
                            for (cell, outcome) in &suite {
                                test_case(w, cell, outcome)?;
                            }
                            Ok(())
                        })?;
                }
                Ok(())
            })?;
        Ok(())
    })();
    written.expect("writing to a Vec cannot fail");
    String::from_utf8(writer.into_inner()).expect("the writer writes UTF-8")
}

/// How a cell reads in JUnit.
enum Outcome {
    Passed,
    Failure(String),
    Error(String),
    Skipped,
}

fn outcome(cell: &Cell) -> Outcome {
    let run_ok = match &cell.facts {
        Some(facts) => facts.succeeded(),
        None => cell.status == "succeeded",
    };
    let mut errors: Vec<String> = cell.error.iter().cloned().collect();
    if cell.pass.is_some() && !run_ok {
        let why = cell.facts.as_ref().and_then(|f| f.error.as_deref());
        let ended = cell
            .facts
            .as_ref()
            .map_or(cell.status.as_str(), |f| f.outcome.as_str());
        errors.push(match why {
            Some(why) => format!("the run {ended}: {why}"),
            None => format!("the run {ended}"),
        });
    }
    for v in &cell.verdicts {
        if let Some(error) = &v.error {
            errors.push(format!("{} could not grade: {error}", v.grader));
        }
    }
    if !errors.is_empty() {
        return Outcome::Error(errors.join("; "));
    }
    match cell.pass {
        None => Outcome::Skipped,
        Some(true) => Outcome::Passed,
        Some(false) => {
            let reasons: Vec<String> = cell
                .verdicts
                .iter()
                .filter(|v| v.required && !v.pass)
                .map(|v| format!("{}: {}", v.grader, v.reason))
                .collect();
            Outcome::Failure(match reasons.is_empty() {
                true => "failed".into(),
                false => reasons.join("; "),
            })
        }
    }
}

fn test_case(w: &mut Writer<Vec<u8>>, cell: &Cell, outcome: &Outcome) -> std::io::Result<()> {
    let latency_ms = cell.facts.as_ref().map_or(0, |f| f.latency_ms);
    let time = format!("{}.{:03}", latency_ms / 1000, latency_ms % 1000);
    let name = xml_text(&format!("{}#{}", cell.case_id, cell.rep));
    w.create_element("testcase")
        .with_attribute(("classname", xml_text(&cell.version).as_str()))
        .with_attribute(("name", name.as_str()))
        .with_attribute(("time", time.as_str()))
        .write_inner_content(|w| {
            let mut problem = |tag: &str, message: &str| {
                w.create_element(tag)
                    .with_attribute(("message", xml_text(message).as_str()))
                    .write_empty()
                    .map(drop)
            };
            match outcome {
                Outcome::Passed => {}
                Outcome::Failure(message) => problem("failure", message)?,
                Outcome::Error(message) => problem("error", message)?,
                Outcome::Skipped => {
                    w.create_element("skipped").write_empty()?;
                }
            }
            if let Some(run_id) = cell.run_id {
                w.create_element("system-out")
                    .write_text_content(BytesText::new(&format!("run {run_id}")))?;
            }
            Ok(())
        })?;
    Ok(())
}

/// `text` with the characters XML 1.0 cannot hold (control characters but
/// tab, line feed and carriage return) replaced by U+FFFD; the writer
/// escapes the rest.
fn xml_text(text: &str) -> String {
    text.chars()
        .map(|c| match c {
            '\u{0}'..='\u{8}'
            | '\u{B}'
            | '\u{C}'
            | '\u{E}'..='\u{1F}'
            | '\u{FFFE}'
            | '\u{FFFF}' => '\u{FFFD}',
            c => c,
        })
        .collect()
}

/// The summary as Markdown: a table of the versions (pass rate with its
/// 95% interval, `83.3% (55.2–95.3)`; passed and graded cells; errors; cost
/// and latency medians; tokens), then the verdict changes, regressions
/// first.
pub fn markdown(name: &str, summary: &Summary) -> String {
    let mut out = format!("# Eval {}\n\n", md_text(name));
    out.push_str("| version | pass rate (95% CI) | passed | graded | errors | cost p50 | latency p50 | tokens |\n");
    out.push_str("|---|---|---:|---:|---:|---:|---:|---:|\n");
    for v in &summary.versions {
        let rate = match v.graded {
            0 => "–".to_owned(),
            _ => format!(
                "{} ({}–{})",
                percent(v.pass_rate),
                trim_percent(v.ci95.0),
                trim_percent(v.ci95.1)
            ),
        };
        out.push_str(&format!(
            "| {} | {rate} | {} | {} | {} | {} | {} | {} |\n",
            md_text(&v.version),
            v.passed,
            v.graded,
            v.errors,
            usd(v.cost_usd_micros_p50),
            duration(v.latency_ms_p50),
            v.tokens_total
        ));
    }
    out.push_str("\n## Verdict changes\n\n");
    if summary.changes.is_empty() {
        out.push_str("No case changes its verdict.\n");
    }
    let (regressions, improvements): (Vec<_>, Vec<_>) =
        summary.changes.iter().partition(|c| c.is_regression());
    for c in regressions.into_iter().chain(improvements) {
        let (what, from, to) = match c.is_regression() {
            true => ("Regression", "passes", "fails"),
            false => ("Improvement", "fails", "passes"),
        };
        out.push_str(&format!(
            "- **{what}** {}: {from} under {}, {to} under {}\n",
            md_text(&c.case_id),
            md_text(&c.from_version),
            md_text(&c.to_version)
        ));
    }
    out
}

/// A percentage without the sign, one decimal (`55.2`).
fn trim_percent(rate: f64) -> String {
    format!("{:.1}", rate * 100.0)
}

/// USD micros as dollars (`$0.0123`).
fn usd(micros: u64) -> String {
    format!("${:.4}", micros as f64 / 1e6)
}

/// ms as `850 ms` or `1.2 s`.
fn duration(ms: u64) -> String {
    match ms {
        0..1000 => format!("{ms} ms"),
        _ => format!("{:.1} s", ms as f64 / 1000.0),
    }
}

/// `text` safe in a Markdown table cell or list item: Markdown's special
/// characters escaped with a backslash (the pipe among them), line breaks
/// as spaces.
fn md_text(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\n' | '\r' => out.push(' '),
            '\\' | '`' | '*' | '_' | '[' | ']' | '<' | '>' | '|' | '#' | '!' => {
                out.push('\\');
                out.push(c);
            }
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use quick_xml::{Reader, XmlVersion};
    use uuid::Uuid;

    use super::*;
    use crate::grade::Verdict;
    use crate::stats::{summarize, tests::cell};

    /// Every element of `xml` with its attributes, unescaped, in order.
    fn elements(xml: &str) -> Vec<(String, Vec<(String, String)>)> {
        let mut reader = Reader::from_str(xml);
        let mut out = Vec::new();
        loop {
            match reader.read_event().expect("well-formed XML") {
                Event::Eof => return out,
                Event::Start(e) | Event::Empty(e) => {
                    let name = e.name().as_ref().to_owned();
                    let attributes = e
                        .attributes()
                        .map(|a| {
                            let a = a.unwrap();
                            let key = a.key.as_ref().to_owned();
                            (
                                key,
                                a.normalized_value(XmlVersion::Explicit1_0)
                                    .unwrap()
                                    .into_owned(),
                            )
                        })
                        .collect();
                    out.push((name, attributes));
                }
                _ => {}
            }
        }
    }

    fn attr<'a>(element: &'a (String, Vec<(String, String)>), key: &str) -> &'a str {
        &element.1.iter().find(|(k, _)| k == key).expect(key).1
    }

    #[test]
    fn junit_counts_escapes_and_parses_back() {
        let mut failed = cell("v<1>", "c&\"1\"", 0, Some(false), 1234);
        failed.verdicts = vec![
            Verdict {
                grader: "exact".into(),
                score: 0.0,
                pass: false,
                required: true,
                reason: "expected \"<ok>\" & more".into(),
                error: None,
            },
            Verdict {
                grader: "tone".into(),
                score: 0.0,
                pass: false,
                required: false,
                reason: "ignored".into(),
                error: None,
            },
        ];
        let mut errored = cell("v<1>", "c2", 1, Some(false), 1);
        errored.verdicts = vec![Verdict::grading_error(
            "judge",
            true,
            "the judge answered garbage: x",
        )];
        let mut run_failed = cell("v2", "c2", 0, Some(false), 1);
        let facts = run_failed.facts.as_mut().unwrap();
        facts.outcome = "failed".into();
        facts.error = Some("boom\u{1}".into());
        let cells = vec![
            cell("v<1>", "ok", 0, Some(true), 5),
            failed,
            errored,
            cell("v<1>", "later", 0, None, 0),
            run_failed,
        ];
        let xml = junit("refunds & \"more\"", &cells);
        assert!(
            xml.contains("&lt;") && xml.contains("&amp;") && xml.contains("&quot;"),
            "{xml}"
        );
        let elements = elements(&xml);
        let names: Vec<&str> = elements.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "testsuites",
                "testsuite",
                "testcase",
                "system-out",
                "testcase",
                "failure",
                "system-out",
                "testcase",
                "error",
                "system-out",
                "testcase",
                "skipped",
                "system-out",
                "testsuite",
                "testcase",
                "error",
                "system-out"
            ]
        );
        assert_eq!(attr(&elements[0], "name"), "refunds & \"more\"");
        let suite = &elements[1];
        let counts: Vec<&str> = ["name", "tests", "failures", "errors", "skipped"]
            .iter()
            .map(|k| attr(suite, k))
            .collect();
        assert_eq!(counts, ["v<1>", "4", "1", "1", "1"]);
        let case = &elements[4];
        assert_eq!(
            (
                attr(case, "classname"),
                attr(case, "name"),
                attr(case, "time")
            ),
            ("v<1>", "c&\"1\"#0", "12.340")
        );
        assert_eq!(
            attr(&elements[5], "message"),
            "exact: expected \"<ok>\" & more"
        );
        assert_eq!(
            attr(&elements[8], "message"),
            "judge could not grade: the judge answered garbage: x"
        );
        assert_eq!(
            attr(&elements[15], "message"),
            "the run failed: boom\u{FFFD}"
        );
        assert!(xml.contains(&format!("run {}", Uuid::nil())));
    }

    #[test]
    fn markdown_tables_and_changes() {
        let cells = vec![
            cell("v1", "c|1", 0, Some(true), 1500),
            cell("v2", "c|1", 0, Some(false), 2_000_000),
            cell("v1", "c2", 0, Some(false), 3000),
            cell("v2", "c2", 0, Some(true), 1),
        ];
        let md = markdown(
            "refunds",
            &summarize(&["v1".into(), "v2".into(), "v3".into()], &cells),
        );
        assert!(
            md.starts_with("# Eval refunds\n\n| version | pass rate (95% CI) |"),
            "{md}"
        );
        assert!(
            md.contains("| v1 | 50.0% (9.5–90.5) | 1 | 2 | 0 | $0.0015 | 15.0 s | 20 |"),
            "{md}"
        );
        assert!(
            md.contains("| v3 | – | 0 | 0 | 0 | $0.0000 | 0 ms | 0 |"),
            "{md}"
        );
        let changes = md.split("## Verdict changes\n\n").nth(1).unwrap();
        assert_eq!(
            changes,
            "- **Regression** c\\|1: passes under v1, fails under v2\n\
             - **Improvement** c2: fails under v1, passes under v2\n"
        );
        let none = markdown("e", &summarize(&["v1".into()], &cells));
        assert!(none.ends_with("## Verdict changes\n\nNo case changes its verdict.\n"));
    }
}
