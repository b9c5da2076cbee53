//! `glia eval run` end to end, on its embedded single node: the helpdesk
//! example's regression found and gated (JUnit XML, Markdown, exit codes),
//! an experiment on a data file surviving `kill -9` with every cell graded
//! once and no refund applied twice, bad input refused before anything
//! runs, and a tau-bench replay eval.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use glia_testkit::{TempDir, workspace_root};
use quick_xml::events::{BytesStart, Event};
use quick_xml::{Reader, XmlVersion};
use serde_json::Value;

/// How long one `glia eval run` may take before the test gives up (the
/// machine may be small and busy: no timing is asserted).
const PATIENCE: Duration = Duration::from_secs(600);

/// A `glia` process run from the workspace root (so the example's relative
/// paths work), its output in files; killed if dropped while running.
struct Glia {
    child: Child,
    stdout: PathBuf,
    stderr: PathBuf,
}

/// How a `glia` process ended.
struct Done {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

impl Done {
    fn code(&self) -> Option<i32> {
        self.status.code()
    }

    /// The gate's findings (stderr's `gate:` lines).
    fn gate(&self) -> Vec<&str> {
        self.stderr
            .lines()
            .filter(|l| l.starts_with("gate:"))
            .collect()
    }

    /// Both streams, for assertion messages.
    fn show(&self) -> String {
        format!(
            "exit {:?}\n--- stdout\n{}\n--- stderr\n{}",
            self.status, self.stdout, self.stderr
        )
    }
}

impl Glia {
    /// Start `glia ARGS` with `env`, its streams in `dir/TAG.out` and
    /// `dir/TAG.err`.
    fn start(dir: &Path, tag: &str, args: &[&str], env: &[(&str, &str)]) -> Glia {
        let stdout = dir.join(format!("{tag}.out"));
        let stderr = dir.join(format!("{tag}.err"));
        let child = Command::new(env!("CARGO_BIN_EXE_glia"))
            .args(args)
            .current_dir(workspace_root())
            .env_remove("GLIA_SERVER")
            .env_remove("GLIA_TOKEN")
            .env_remove("GLIA_DEMO_TOOL_DELAY_MS")
            .env_remove("GLIA_DEMO_EFFECTS")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&stdout).unwrap())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .expect("glia starts");
        Glia {
            child,
            stdout,
            stderr,
        }
    }

    /// Whether it has ended (reaped when so).
    fn ended(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().unwrap()
    }

    fn done(&self, status: ExitStatus) -> Done {
        Done {
            status,
            stdout: std::fs::read_to_string(&self.stdout).unwrap(),
            stderr: std::fs::read_to_string(&self.stderr).unwrap(),
        }
    }

    /// Wait for its end ([`PATIENCE`] at most: then kill it and panic
    /// with its output).
    fn finish(mut self) -> Done {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(status) = self.ended() {
                return self.done(status);
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let status = self.child.wait().unwrap();
                panic!(
                    "glia did not end in {PATIENCE:?}\n{}",
                    self.done(status).show()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// SIGKILL it; how it ended.
    fn kill9(mut self) -> Done {
        self.child.kill().unwrap();
        let status = self.child.wait().unwrap();
        self.done(status)
    }
}

impl Drop for Glia {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// `glia ARGS` run to its end from the workspace root.
fn glia(dir: &Path, tag: &str, args: &[&str]) -> Done {
    Glia::start(dir, tag, args, &[]).finish()
}

/// The helpdesk example's agents, scripts and demo tools.
const HELPDESK: [&str; 5] = [
    "--agents",
    "examples/evals/agents",
    "--scripts",
    "examples/evals/scripts",
    "--demo",
];

fn args<'a>(head: &[&'a str], tail: &[&'a str]) -> Vec<&'a str> {
    head.iter().chain(tail).copied().collect()
}

fn path(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 temporary path")
}

// ---------------------------------------------------------------------------
// The example finds the regression.

/// A test suite of a JUnit file: its attributes and its test cases (name,
/// failed, system-out).
#[derive(Debug, Default)]
struct Suite {
    name: String,
    tests: u32,
    failures: u32,
    errors: u32,
    cases: Vec<(String, bool, String)>,
}

fn attribute(e: &BytesStart, key: &str) -> String {
    e.try_get_attribute(key)
        .unwrap()
        .unwrap_or_else(|| panic!("no attribute {key}"))
        .normalized_value(XmlVersion::Explicit1_0)
        .unwrap()
        .into_owned()
}

/// The suites of a JUnit file; panics unless it is well-formed XML.
fn junit(xml: &str) -> Vec<Suite> {
    let mut reader = Reader::from_str(xml);
    let mut suites: Vec<Suite> = Vec::new();
    let mut in_out = false;
    loop {
        match reader.read_event().expect("well-formed XML") {
            Event::Eof => return suites,
            Event::Start(e) | Event::Empty(e) => match e.name().as_ref() {
                "testsuite" => suites.push(Suite {
                    name: attribute(&e, "name"),
                    tests: attribute(&e, "tests").parse().unwrap(),
                    failures: attribute(&e, "failures").parse().unwrap(),
                    errors: attribute(&e, "errors").parse().unwrap(),
                    cases: Vec::new(),
                }),
                "testcase" => suites
                    .last_mut()
                    .expect("a testcase in a suite")
                    .cases
                    .push((attribute(&e, "name"), false, String::new())),
                "failure" | "error" => {
                    suites.last_mut().unwrap().cases.last_mut().unwrap().1 = true;
                }
                "system-out" => in_out = true,
                _ => {}
            },
            Event::Text(t) if in_out => {
                suites.last_mut().unwrap().cases.last_mut().unwrap().2 += &t.xml10_content();
            }
            Event::End(e) if e.name().as_ref() == "system-out" => in_out = false,
            _ => {}
        }
    }
}

#[test]
fn the_example_finds_the_regression_and_fails_the_gate() {
    let tmp = TempDir::new();
    let junit_file = tmp.path().join("junit.xml");
    let markdown_file = tmp.path().join("summary.md");
    let out = glia(
        tmp.path(),
        "baseline",
        &args(
            &["eval", "run", "examples/evals/helpdesk.toml"],
            &args(
                &HELPDESK,
                &[
                    "--baseline",
                    "helpdesk@1",
                    "--junit",
                    path(&junit_file),
                    "--markdown",
                    path(&markdown_file),
                ],
            ),
        ),
    );
    assert_eq!(out.code(), Some(1), "{}", out.show());

    // The gate names exactly the two regressions, both under version 2.
    assert_eq!(
        out.gate(),
        [
            "gate: case \"sub\" regressed under helpdesk@2: passed under helpdesk@1 (2/2), fails (0/2)",
            "gate: case \"refund\" regressed under helpdesk@2: passed under helpdesk@1 (2/2), fails (0/2)",
        ],
        "{}",
        out.show()
    );
    assert!(
        out.stderr.contains("the gate failed (2 finding(s))"),
        "{}",
        out.show()
    );
    // The table: the experiment completed, version 2 passed 8 of 12.
    let first = out.stdout.lines().next().unwrap_or_default();
    assert!(
        first.starts_with("experiment ") && first.ends_with("(helpdesk) on helpdesk@1: completed"),
        "{}",
        out.show()
    );
    let row = |v: &str| {
        out.stdout
            .lines()
            .find(|l| l.starts_with(v))
            .unwrap_or_else(|| panic!("no row {v}\n{}", out.show()))
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
    };
    assert_eq!(row("helpdesk@1"), ["helpdesk@1", "12/12", "100.0%"]);
    assert_eq!(row("helpdesk@2"), ["helpdesk@2", "12/12", "66.7%"]);

    // JUnit: a suite per version, a test case per cell, the four failing
    // cells of version 2, each case naming its run.
    let xml = std::fs::read_to_string(&junit_file).unwrap();
    let suites = junit(&xml);
    let names: Vec<&str> = suites.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["helpdesk@1", "helpdesk@2"], "{xml}");
    assert_eq!(suites.iter().map(|s| s.cases.len()).sum::<usize>(), 24);
    let failed = |s: &Suite| -> BTreeSet<String> {
        s.cases
            .iter()
            .filter(|c| c.1)
            .map(|c| c.0.clone())
            .collect()
    };
    let (v1, v2) = (&suites[0], &suites[1]);
    assert_eq!((v1.tests, v1.failures, v1.errors), (12, 0, 0), "{xml}");
    assert_eq!(v1.cases.len(), 12);
    assert!(failed(v1).is_empty(), "{xml}");
    assert_eq!((v2.tests, v2.failures, v2.errors), (12, 4, 0), "{xml}");
    assert_eq!(v2.cases.len(), 12);
    assert_eq!(
        failed(v2),
        BTreeSet::from(["sub#0", "sub#1", "refund#0", "refund#1"].map(String::from)),
        "{xml}"
    );
    let cases: BTreeSet<&str> = v1.cases.iter().map(|c| c.0.as_str()).collect();
    assert_eq!(cases.len(), 12, "cell names are distinct: {xml}");
    let runs: BTreeSet<&str> = suites
        .iter()
        .flat_map(|s| &s.cases)
        .map(|c| {
            let run = c.2.strip_prefix("run ").expect("a case names its run");
            uuid::Uuid::parse_str(run).expect("a run id");
            run
        })
        .collect();
    assert_eq!(runs.len(), 24, "a run per cell: {xml}");

    // Markdown: both regressions, and version 2's 8 of 12.
    let md = std::fs::read_to_string(&markdown_file).unwrap();
    let regressions: Vec<&str> = md
        .lines()
        .filter(|l| l.starts_with("- **Regression**"))
        .collect();
    assert_eq!(
        regressions,
        [
            "- **Regression** sub: passes under helpdesk@1, fails under helpdesk@2",
            "- **Regression** refund: passes under helpdesk@1, fails under helpdesk@2",
        ],
        "{md}"
    );
    assert!(
        md.lines()
            .any(|l| l.starts_with("| helpdesk@2 | 66.7% ") && l.contains("| 8 | 12 | 0 |")),
        "{md}"
    );
}

#[test]
fn the_pass_rate_gate_without_a_baseline() {
    let tmp = TempDir::new();
    let run = |rate: &str| {
        glia(
            tmp.path(),
            rate,
            &args(
                &["eval", "run", "examples/evals/helpdesk.toml"],
                &args(&HELPDESK, &["--min-pass-rate", rate]),
            ),
        )
    };
    // Version 2 passes 8 of 12 (66.7%): enough for 0.5…
    let lenient = run("0.5");
    assert_eq!(lenient.code(), Some(0), "{}", lenient.show());
    assert!(lenient.gate().is_empty(), "{}", lenient.show());
    // …not for 0.9; version 1 (12 of 12) passes either way.
    let strict = run("0.9");
    assert_eq!(strict.code(), Some(1), "{}", strict.show());
    assert_eq!(
        strict.gate(),
        ["gate: helpdesk@2: pass rate 66.7% is below 90.0% (8 of 12 graded cells passed)"],
        "{}",
        strict.show()
    );
}

// ---------------------------------------------------------------------------
// Durable under kill -9.

fn read_db(db: &Path) -> rusqlite::Connection {
    rusqlite::Connection::open(db).unwrap()
}

fn count(conn: &rusqlite::Connection, sql: &str) -> u64 {
    conn.query_row(sql, [], |r| r.get::<_, i64>(0))
        .unwrap()
        .try_into()
        .unwrap()
}

/// The effects file's lines as (kind, run id, key).
fn effects(file: &Path) -> Vec<(String, String, String)> {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    assert!(
        text.is_empty() || text.ends_with('\n'),
        "a cut line: {text}"
    );
    text.lines()
        .map(|l| {
            let (kind, key) = l.split_once(' ').expect("`KIND KEY`");
            let run = key.split(':').next().unwrap().to_owned();
            (kind.to_owned(), run, key.to_owned())
        })
        .collect()
}

#[test]
fn an_experiment_survives_kill_9_of_the_single_node() {
    let tmp = TempDir::new();
    let root = workspace_root();
    // The example with ten repetitions: 2 versions × 6 cases × 10 = 120
    // cells, 20 of them refunds (each needs an approval, then takes 0.8 s).
    let toml = std::fs::read_to_string(root.join("examples/evals/helpdesk.toml")).unwrap();
    assert!(toml.contains("\nrepetitions = 2\n"), "{toml}");
    std::fs::write(
        tmp.path().join("helpdesk.toml"),
        toml.replace("\nrepetitions = 2\n", "\nrepetitions = 10\n"),
    )
    .unwrap();
    std::fs::copy(
        root.join("examples/evals/cases.jsonl"),
        tmp.path().join("cases.jsonl"),
    )
    .unwrap();
    let eval = tmp.path().join("helpdesk.toml");
    let db = tmp.path().join("node.db");
    let fx = tmp.path().join("effects");
    let argv = args(
        &["eval", "run", path(&eval)],
        &args(&HELPDESK, &["--data", path(&db), "--json"]),
    );
    let env = [
        ("GLIA_DEMO_TOOL_DELAY_MS", "800"),
        ("GLIA_DEMO_EFFECTS", path(&fx)),
    ];

    // Killed once three refunds have been applied.
    let mut first = Glia::start(tmp.path(), "first", &argv, &env);
    let deadline = Instant::now() + PATIENCE;
    let applied = || std::fs::read_to_string(&fx).map_or(0, |t| t.matches('\n').count());
    while applied() < 3 {
        if let Some(status) = first.ended() {
            panic!(
                "glia ended before three refunds\n{}",
                first.done(status).show()
            );
        }
        assert!(
            Instant::now() < deadline,
            "no three refunds in {PATIENCE:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let killed = first.kill9();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(killed.status.signal(), Some(9), "{}", killed.show());
    let (id, graded_before) = {
        let conn = read_db(&db);
        assert_eq!(count(&conn, "SELECT COUNT(*) FROM eval_experiments"), 1);
        let id: String = conn
            .query_row("SELECT id FROM eval_experiments", [], |r| r.get(0))
            .unwrap();
        (id, count(&conn, "SELECT COUNT(*) FROM eval_grades"))
    };
    assert!(
        graded_before < 120,
        "killed mid-run: {graded_before} graded"
    );

    // Run again: the same experiment, continued to its end.
    let out = Glia::start(tmp.path(), "second", &argv, &env).finish();
    assert_eq!(out.code(), Some(0), "{}", out.show());
    let exp: Value = serde_json::from_str(&out.stdout).expect("--json prints the experiment");
    assert_eq!(exp["id"], id.as_str(), "the same experiment");
    assert_eq!(exp["state"], "completed");
    assert_eq!(exp["progress"]["cells"], 120);
    assert_eq!(exp["progress"]["graded"], 120);
    let cells = exp["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 120);
    let mut seen = BTreeSet::new();
    let mut runs = BTreeSet::new();
    let mut passed: BTreeMap<&str, u32> = BTreeMap::new();
    let mut failed: BTreeMap<(&str, &str), u32> = BTreeMap::new();
    let mut refund_runs = BTreeSet::new();
    for c in cells {
        let (version, case) = (
            c["version"].as_str().unwrap(),
            c["case_id"].as_str().unwrap(),
        );
        assert!(
            seen.insert((version, case, c["rep"].as_u64().unwrap())),
            "{c}"
        );
        let run = c["run_id"].as_str().expect("a cell's run").to_owned();
        assert!(runs.insert(run.clone()), "a run for two cells: {c}");
        assert_eq!(c["status"], "succeeded", "{c}");
        match c["pass"].as_bool().expect("every cell graded") {
            true => *passed.entry(version).or_default() += 1,
            false => *failed.entry((version, case)).or_default() += 1,
        }
        if case == "refund" {
            refund_runs.insert(run);
        }
    }
    assert_eq!(
        passed,
        BTreeMap::from([("helpdesk@1", 60), ("helpdesk@2", 40)])
    );
    assert_eq!(
        failed,
        BTreeMap::from([(("helpdesk@2", "refund"), 10), (("helpdesk@2", "sub"), 10)])
    );
    assert_eq!(refund_runs.len(), 20);

    // In the store: one experiment, one grade per cell naming the cell's
    // run, and no run beyond the cells' (the second process made none
    // again for a cell the first had started).
    let conn = read_db(&db);
    assert_eq!(count(&conn, "SELECT COUNT(*) FROM eval_experiments"), 1);
    assert_eq!(count(&conn, "SELECT COUNT(*) FROM eval_grades"), 120);
    assert_eq!(count(&conn, "SELECT COUNT(*) FROM runs"), 120);
    let graded_runs: BTreeSet<String> = conn
        .prepare("SELECT run_id FROM eval_grades")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(graded_runs, runs);

    // Refunds: applied at most once per call (its idempotency key is
    // `{run}:{turn}:{call}`), only by the cells' runs. Nothing delivered a
    // call twice (no `replay`): the agents keep the default
    // `on_interrupted_call`, so a refund the kill interrupted is never run
    // again but ends `outcome_unknown` (applied once or not at all, as the
    // kill fell); every other refund cell's run applied it exactly once.
    let fx = effects(&fx);
    assert!(
        fx.iter().all(|(kind, ..)| kind == "refund"),
        "no call delivered twice: {fx:?}"
    );
    let mut keys = BTreeSet::new();
    for (_, run, key) in &fx {
        assert!(keys.insert(key), "{key} applied twice: {fx:?}");
        assert!(refund_runs.contains(run), "{key} is no refund cell's run");
    }
    for run in &refund_runs {
        let applied = fx.iter().filter(|(_, r, _)| r == run).count();
        let unknown = count(
            &conn,
            &format!(
                "SELECT COUNT(*) FROM events WHERE run_id = '{run}' AND kind = 'tool.error' \
                 AND payload LIKE '%\"error\":\"outcome_unknown\"%'"
            ),
        );
        if unknown == 0 {
            assert_eq!(applied, 1, "run {run}: {fx:?}");
        } else {
            assert_eq!(unknown, 1, "run {run}");
            assert!(applied <= 1, "run {run}: {fx:?}");
        }
    }
}

// ---------------------------------------------------------------------------
// Bad input: nothing run.

#[test]
fn bad_input_fails_naming_the_field_and_runs_nothing() {
    let tmp = TempDir::new();
    let root = workspace_root();
    let toml = std::fs::read_to_string(root.join("examples/evals/helpdesk.toml")).unwrap();
    let cases = std::fs::read_to_string(root.join("examples/evals/cases.jsonl")).unwrap();
    std::fs::write(tmp.path().join("cases.jsonl"), &cases).unwrap();
    // The example patched into TAG.toml, run on TAG.db: it fails; its
    // output and data file.
    let refused = |tag: &str, patched: String| -> (Done, PathBuf) {
        assert_ne!(patched, toml, "the example was patched");
        let eval = tmp.path().join(format!("{tag}.toml"));
        std::fs::write(&eval, patched).unwrap();
        let db = tmp.path().join(format!("{tag}.db"));
        let out = glia(
            tmp.path(),
            tag,
            &args(
                &["eval", "run", path(&eval)],
                &args(&HELPDESK, &["--data", path(&db)]),
            ),
        );
        assert_ne!(out.code(), Some(0), "{}", out.show());
        (out, db)
    };
    let says = |out: &Done, what: &str| {
        assert!(out.stderr.contains(what), "no {what:?} in\n{}", out.show());
    };
    let empty = |db: &Path, tables: &[&str]| {
        let conn = read_db(db);
        for table in tables {
            let rows = count(&conn, &format!("SELECT COUNT(*) FROM {table}"));
            assert_eq!(rows, 0, "{table}");
        }
    };

    // A misspelt grader key: refused before the node even starts.
    let (out, db) = refused(
        "typo",
        toml.replacen(
            "kind = \"contains\"\nexpected = \"answer\"",
            "kind = \"regex\"\npatern = \"4\"",
            1,
        ),
    );
    let file = tmp.path().join("typo.toml");
    says(
        &out,
        &format!("{}: invalid eval: graders[0].patern", file.display()),
    );
    assert!(!db.exists(), "no node started");

    // A dataset file with a duplicate id: its file and line named, before
    // the node even starts.
    std::fs::write(
        tmp.path().join("dup.jsonl"),
        format!("{cases}{}\n", cases.lines().next().unwrap()),
    )
    .unwrap();
    assert_eq!(cases.lines().count(), 6);
    let (out, db) = refused("dup", toml.replace("\"cases.jsonl\"", "\"dup.jsonl\""));
    let file = tmp.path().join("dup.jsonl");
    says(
        &out,
        &format!("{}: line 7: id: \"add\" is used by line 1", file.display()),
    );
    assert!(!db.exists(), "no node started");

    // A version the agent does not have.
    let (out, db) = refused("seven", toml.replace("\"helpdesk@2\"]", "\"helpdesk@7\"]"));
    says(&out, &tmp.path().join("seven.toml").display().to_string());
    says(&out, "eval.agents[1]: the tenant has no agent helpdesk@7");
    empty(&db, &["runs", "eval_experiments", "eval_grades"]);
}

// ---------------------------------------------------------------------------
// A tau-bench replay eval.

#[test]
fn a_tau_bench_replay_eval_of_ten_conversations() {
    let tmp = TempDir::new();
    let recording = "examples/tau-bench-airline/gpt-4o-airline.json";
    let out = glia(
        tmp.path(),
        "tau",
        &[
            "eval",
            "dataset",
            "tau",
            recording,
            "--out-dir",
            path(tmp.path()),
        ],
    );
    assert_eq!(out.code(), Some(0), "{}", out.show());
    assert!(out.stdout.contains("(200 cases)"), "{}", out.show());
    let dataset = tmp.path().join("tau-airline.jsonl");
    let text = std::fs::read_to_string(&dataset).unwrap();
    assert_eq!(text.lines().count(), 200);
    let ten: Vec<&str> = text.lines().take(10).collect();
    std::fs::write(&dataset, ten.join("\n") + "\n").unwrap();
    let expected: BTreeMap<String, Value> = ten
        .iter()
        .map(|l| {
            let case: Value = serde_json::from_str(l).unwrap();
            (
                case["id"].as_str().unwrap().to_owned(),
                case["expected"]["tools"].clone(),
            )
        })
        .collect();
    assert!(
        expected.values().any(|t| t.as_array().unwrap().len() > 5),
        "some conversations call tools"
    );

    let eval = tmp.path().join("tau-airline.json");
    let out = glia(
        tmp.path(),
        "replay",
        &["eval", "run", path(&eval), "--replay", recording, "--json"],
    );
    assert_eq!(out.code(), Some(0), "{}", out.show());
    let exp: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(exp["state"], "completed");
    assert_eq!(exp["progress"]["cells"], 10);
    assert_eq!(exp["progress"]["graded"], 10);
    let summary = &exp["summary"]["versions"][0];
    assert_eq!(summary["version"], "recorded");
    assert_eq!(
        (&summary["passed"], &summary["graded"]),
        (&10.into(), &10.into())
    );
    let cells = exp["cells"].as_array().unwrap();
    let ids: BTreeSet<&str> = cells
        .iter()
        .map(|c| c["case_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, expected.keys().map(String::as_str).collect());
    for c in cells {
        let tools = &expected[c["case_id"].as_str().unwrap()];
        let n = tools.as_array().unwrap().len();
        assert_eq!(c["pass"], true, "{c}");
        let verdicts = c["verdicts"].as_array().unwrap();
        assert_eq!(verdicts.len(), 1, "{c}");
        let v = &verdicts[0];
        assert_eq!(v["grader"], "trajectory", "{c}");
        assert_eq!(
            (&v["pass"], &v["score"]),
            (&true.into(), &1.0.into()),
            "{c}"
        );
        let reason = if n == 0 {
            "no calls, as expected".to_owned()
        } else {
            format!("the {n} expected calls made, in order")
        };
        assert_eq!(v["reason"], reason.as_str(), "{c}");
        // The calls the replayed run made are the recorded ones, exactly.
        assert_eq!(&c["facts"]["tool_calls"], tools, "{c}");
    }
}

// ---------------------------------------------------------------------------
// A replay dataset from recorded runs.

/// Three refunds recorded on `glia dev` (a real refund each, in the
/// effects file) and a run that failed become a replay dataset with
/// `glia eval dataset from-runs` (the failed run skipped, named); another
/// version run on it passes the trajectory and answer graders, and no
/// refund is applied again: the recording answered every call.
#[test]
fn a_replay_dataset_from_runs_touches_nothing_the_runs_reached() {
    let tmp = TempDir::new();
    let fx = tmp.path().join("effects");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let listen = format!("127.0.0.1:{port}");
    let server = format!("http://{listen}");
    let _dev = Glia::start(
        tmp.path(),
        "dev",
        &["dev", "--demo", "--listen", &listen, "--workers", "1"],
        &[("GLIA_DEMO_EFFECTS", path(&fx))],
    );
    let deadline = Instant::now() + PATIENCE;
    while !reqwest::blocking::get(format!("{server}/healthz"))
        .is_ok_and(|r| r.status().is_success())
    {
        assert!(Instant::now() < deadline, "glia dev did not come up");
        std::thread::sleep(Duration::from_millis(100));
    }
    let submit = |tag: &str, model: &str| -> String {
        let config = tmp.path().join(format!("{tag}.json"));
        let body = serde_json::json!({"model": model, "tools": ["get_order", "refund_order"]});
        std::fs::write(&config, body.to_string()).unwrap();
        let out = glia(
            tmp.path(),
            tag,
            &[
                "submit",
                "--server",
                &server,
                "--json",
                "--config",
                path(&config),
                "Refund order A1",
            ],
        );
        let first: Value = serde_json::from_str(out.stdout.lines().next().unwrap_or("null"))
            .unwrap_or_else(|e| panic!("{e}: {}", out.show()));
        first["run_id"]
            .as_str()
            .unwrap_or_else(|| panic!("{}", out.show()))
            .to_owned()
    };
    let recorded: Vec<String> = (0..3)
        .map(|i| submit(&format!("rec{i}"), "script:refund"))
        .collect();
    let failed = submit("failed", "script:no-such-script");
    assert_eq!(
        effects(&fx)
            .iter()
            .filter(|(kind, ..)| kind == "refund")
            .count(),
        3,
        "one refund per recorded run"
    );

    let cases = tmp.path().join("cases.jsonl");
    let mut from = vec!["eval", "dataset", "from-runs", "--server", &server];
    for id in recorded.iter().chain([&failed]) {
        from.extend(["--run", id.as_str()]);
    }
    from.extend(["--out", path(&cases), "--push", "replayed"]);
    let out = glia(tmp.path(), "from-runs", &from);
    assert_eq!(out.code(), Some(0), "{}", out.show());
    assert!(
        out.stdout.contains("dataset replayed@1 (3 cases)"),
        "{}",
        out.show()
    );
    assert!(
        out.stderr
            .contains(&format!("skipped run {failed}: the run failed")),
        "{}",
        out.show()
    );
    let lines: Vec<Value> = std::fs::read_to_string(&cases)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3);
    for case in &lines {
        let tools: BTreeSet<&str> = case["recorded_tools"]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            tools,
            BTreeSet::from(["get_order", "refund_order"]),
            "{case}"
        );
        let calls: Vec<&str> = case["recorded_tools"]["calls"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(calls, ["get_order", "refund_order"], "{case}");
        assert!(recorded.contains(&case["metadata"]["source_run"].as_str().unwrap().to_owned()));
    }

    // Another version (its own system prompt) on the recording.
    let eval = tmp.path().join("replay.json");
    let spec = serde_json::json!({
        "name": "replay", "dataset": "replayed",
        "agents": [{"label": "v2", "config": {"model": "script:refund", "system": "You are v2."}}],
        "graders": [{"kind": "trajectory", "order": "exact", "args": "exact"},
                    {"kind": "contains", "expected": "answer"}],
    });
    std::fs::write(&eval, spec.to_string()).unwrap();
    let out = glia(
        tmp.path(),
        "replay",
        &[
            "eval",
            "run",
            path(&eval),
            "--server",
            &server,
            "--min-pass-rate",
            "1",
        ],
    );
    assert_eq!(out.code(), Some(0), "{}", out.show());
    assert!(out.stdout.contains("100.0%"), "{}", out.show());
    assert_eq!(
        effects(&fx).len(),
        3,
        "the replay applied no refund: {:?}",
        effects(&fx)
    );
}
