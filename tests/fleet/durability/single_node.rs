//! The single node: dispatcher and workers in one process on one SQLite
//! file (`glia serve --data`, `glia batch --data`), killed with `kill -9` at
//! random moments and started again; and its runs moved to a fleet's
//! Postgres with `glia export` / `glia import`, where they continue.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use glia_backends::archive::{Archive, RunRecord};
use glia_backends::sqlite::{SqliteLog, SqliteOptions};
use glia_backends::{RunFilter, RunLog};
use glia_proto::{Disposition, EventKind};
use glia_testkit::fleet::{
    Api, Fleet, KINDS, assert_whole_recording, check_batch, drive_all, glia_batch, mixed_scripts,
    submit_kind, summary,
};
use glia_testkit::isolation::TempDir;
use serde_json::Value;

/// A number in `range`, different on every call (no seed to pin: the kill
/// moments are meant to vary between runs of the test; they are printed).
fn random_in(range: std::ops::Range<u64>) -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let mixed = nanos
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407)
        ^ (std::process::id() as u64).rotate_left(17);
    range.start + (mixed >> 11) % (range.end - range.start)
}

/// Runs done in the data file, read without disturbing its owner (0 while
/// the file or its tables do not exist yet).
fn done_runs(data: &Path) -> usize {
    let Ok(conn) =
        rusqlite::Connection::open_with_flags(data, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
    else {
        return 0;
    };
    let _ = conn.busy_timeout(Duration::from_secs(5));
    conn.query_row("SELECT count(*) FROM runs WHERE status = 'done'", [], |r| {
        r.get::<_, i64>(0)
    })
    .map_or(0, |n| n as usize)
}

/// Jobs in the data file's queue (taken and not yet acked included).
fn queued_jobs(data: &Path) -> i64 {
    let conn =
        rusqlite::Connection::open_with_flags(data, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap();
    conn.busy_timeout(Duration::from_secs(5)).unwrap();
    conn.query_row("SELECT count(*) FROM jobs WHERE dead = 0", [], |r| r.get(0))
        .unwrap()
}

/// Every run of the data file, whole.
fn records(data: &Path) -> Vec<RunRecord> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let log = SqliteLog::open(data, SqliteOptions::default())
            .await
            .unwrap();
        let runs = log
            .list_runs(&RunFilter {
                limit: 1000,
                ..RunFilter::default()
            })
            .await
            .unwrap();
        let mut out = Vec::new();
        for r in runs {
            out.push(log.export_run(r.run_id).await.unwrap());
        }
        out
    })
}

/// What must hold of a log whatever the process went through: sequences 1,
/// 2, 3 … with no gap or repeat, the log replays, every tool call has exactly
/// one result, and a call that needed approval ran again only after a
/// person approved it again as interrupted (each `approval.requested` after
/// the first of a call is marked `interrupted`). Returns the interrupted
/// approvals seen.
fn check_run(record: &RunRecord) -> usize {
    record
        .validate()
        .unwrap_or_else(|e| panic!("run {}: {e}", record.run_id));
    let mut interrupted = 0;
    let events = &record.events;
    for (i, e) in events.iter().enumerate() {
        let EventKind::ToolCall(call) = &e.kind else {
            continue;
        };
        let window = events[i + 1..].iter().take_while(
            |later| !matches!(&later.kind, EventKind::ToolCall(c) if c.call_id == call.call_id),
        );
        let (mut results, mut requests, mut again) = (0, 0, 0);
        for later in window {
            match &later.kind {
                EventKind::ToolResult { call_id, .. } | EventKind::ToolError { call_id, .. }
                    if *call_id == call.call_id =>
                {
                    results += 1
                }
                EventKind::ApprovalRequested {
                    call_id,
                    interrupted,
                    ..
                } if *call_id == call.call_id => {
                    requests += 1;
                    again += usize::from(*interrupted);
                }
                _ => {}
            }
        }
        assert_eq!(
            results, 1,
            "run {} seq {}: call {} has {results} results",
            record.run_id, e.seq, call.call_id
        );
        if matches!(call.disposition, Disposition::Approval) {
            assert_eq!(
                requests,
                1 + again,
                "run {} call {}: asked again without the interrupted mark",
                record.run_id,
                call.call_id
            );
        }
        interrupted += again;
    }
    interrupted
}

#[test]
fn a_batch_on_a_data_file_killed_three_times_still_reproduces_all_200() {
    let dir = TempDir::new();
    let data = dir.db();
    let data_arg = data.to_str().unwrap();
    let mut thresholds: Vec<u64> = (0..3)
        .map(|i| random_in(10 + i * 50..50 + i * 50))
        .collect();
    thresholds.sort();
    for threshold in thresholds {
        let mut child = glia_batch(&["--data", data_arg]).spawn().unwrap();
        let deadline = Instant::now() + Duration::from_secs(180);
        while done_runs(&data) < threshold as usize {
            assert!(
                Instant::now() < deadline,
                "the batch made no progress past {} runs",
                done_runs(&data)
            );
            assert!(
                child.try_wait().unwrap().is_none(),
                "the batch ended before its kill at {threshold} runs"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let extra = random_in(0..150);
        std::thread::sleep(Duration::from_millis(extra));
        eprintln!("kill -9 after {} runs done (+{extra} ms)", done_runs(&data));
        child.kill().unwrap(); // SIGKILL: driver, dispatcher and workers at once
        child.wait().unwrap();
    }
    let s = summary(glia_batch(&["--data", data_arg]).output().unwrap());
    assert_whole_recording(&s);
    let records = records(&data);
    assert_eq!(
        records.len(),
        200,
        "the same 200 runs: resumed, not admitted again"
    );
    let interrupted: usize = records.iter().map(check_run).sum();
    assert_eq!(
        interrupted as u64,
        s["interrupted_approvals"].as_u64().unwrap(),
        "{s}"
    );
}

/// `glia serve --data FILE` as a process on a free port, with the mixed
/// batch's scripts; its effects go to the API's effects file.
pub(super) struct Node {
    pub(super) api: Api,
    data: PathBuf,
    child: Option<Child>,
}

impl Node {
    pub(super) fn new(api: Api, data: PathBuf) -> Node {
        Node {
            api,
            data,
            child: None,
        }
    }

    pub(super) fn start(&mut self) {
        let port = self.api.server.rsplit(':').next().unwrap().to_owned();
        let child = Command::new(glia_testkit::bin::glia_bin())
            .args([
                "serve",
                "--demo",
                "--data",
                self.data.to_str().unwrap(),
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--reconcile-every",
                "1",
            ])
            .args([
                "--scripts",
                self.api.dir.join("scripts").to_str().unwrap(),
                "--lease-ms",
                "2000",
            ])
            .env("GLIA_DEMO_EFFECTS", self.api.effects_file())
            .env("GLIA_DEMO_TOOL_DELAY_MS", "30")
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        while !glia_testkit::fleet::http("GET", &format!("{}/readyz", self.api.server), None)
            .is_ok_and(|(s, _)| s == 200)
        {
            assert!(Instant::now() < deadline, "glia serve did not come up");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub(super) fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill().unwrap();
            c.wait().unwrap();
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

pub(super) fn node_api(dir: &Path) -> Api {
    std::fs::create_dir_all(dir.join("scripts")).unwrap();
    for (name, turns) in mixed_scripts() {
        std::fs::write(
            dir.join("scripts").join(format!("{name}.json")),
            serde_json::to_vec(&turns).unwrap(),
        )
        .unwrap();
    }
    Api {
        name: "single-node".into(),
        dir: dir.to_owned(),
        server: format!("http://127.0.0.1:{}", glia_testkit::fleet::free_port()),
        token: None,
    }
}

fn submit_mixed(api: &Api, n: usize, from: usize) -> Vec<(String, String)> {
    (from..from + n)
        .map(|i| {
            (
                KINDS[i % KINDS.len()].to_owned(),
                submit_kind(api, KINDS[i % KINDS.len()], i),
            )
        })
        .collect()
}

/// Killed twice while runs are in flight (tools take 30 ms), started again
/// each time: every run finishes, logs are whole, each refund ran at most
/// once (or is recorded as an unknown outcome). Then stale and duplicate
/// jobs change nothing, and SSE and metrics answer.
#[test]
fn serve_killed_and_started_again_continues_every_run() {
    let dir = TempDir::new();
    let mut node = Node::new(node_api(dir.path()), dir.db());
    node.start();
    let mut runs = Vec::new();
    for round in 0..2 {
        runs.extend(submit_mixed(&node.api, 20, round * 20));
        // Approve what already waits, so refunds are in flight at the kill.
        let deadline = Instant::now() + Duration::from_secs(30);
        while node.api.get("/v1/approvals?limit=100").1["approvals"]
            .as_array()
            .map_or(0, Vec::len)
            == 0
        {
            assert!(Instant::now() < deadline, "no approval was requested");
            std::thread::sleep(Duration::from_millis(10));
        }
        let pending = node.api.get("/v1/approvals?limit=100").1;
        for a in pending["approvals"].as_array().unwrap() {
            let path = format!(
                "/v1/runs/{}/approvals/{}",
                a["run_id"].as_str().unwrap(),
                a["call_id"].as_str().unwrap()
            );
            node.api
                .post(&path, serde_json::json!({ "decision": "approve" }));
        }
        std::thread::sleep(Duration::from_millis(random_in(0..60)));
        node.kill();
        node.start();
    }
    let results = drive_all(&node.api, &runs, Instant::now() + Duration::from_secs(120));
    check_batch(&node.api, &results);
    // Stale and duplicate jobs change nothing: with the node stopped, queue
    // for every run a stale job (head 1) and its current head twice, then
    // start it again and wait until it has taken and acked them all.
    let logs: Vec<Vec<Value>> = runs.iter().map(|(_, id)| node.api.events(id)).collect();
    let effects = node.api.effects();
    node.kill();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let log = SqliteLog::open(&node.data, SqliteOptions::default())
            .await
            .unwrap();
        for (_, id) in &runs {
            let run_id: uuid::Uuid = id.parse().unwrap();
            let head = log.get_run(run_id).await.unwrap().head_seq;
            for head_seq in [1, head, head] {
                glia_backends::JobQueue::publish(
                    &log.queue(),
                    &glia_backends::Job::start(run_id, head_seq),
                )
                .await
                .unwrap();
            }
        }
    });
    node.start();
    let deadline = Instant::now() + Duration::from_secs(60);
    while queued_jobs(&node.data) > 0 {
        assert!(
            Instant::now() < deadline,
            "{} jobs still queued",
            queued_jobs(&node.data)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        runs.iter()
            .map(|(_, id)| node.api.events(id))
            .collect::<Vec<_>>(),
        logs,
        "no log moved"
    );
    assert_eq!(node.api.effects(), effects, "no tool ran again");
    // The rest of the API after the restarts: SSE (`glia submit` streams a
    // run's events to its end) and the dispatcher's metrics.
    let config = dir.path().join("plain.json");
    std::fs::write(
        &config,
        glia_testkit::fleet::mixed_config("plain").to_string(),
    )
    .unwrap();
    let out = Command::new(glia_testkit::bin::glia_bin())
        .args([
            "submit",
            "--server",
            &node.api.server,
            "--json",
            "--config",
            config.to_str().unwrap(),
            "Add 2 and 3.",
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let streamed = String::from_utf8_lossy(&out.stdout);
    assert!(
        streamed.lines().any(|l| l.contains("\"session.complete\"")),
        "{streamed}"
    );
    assert!(node.api.metric("glia_dispatcher_jobs_relayed_total") > 0.0);
}

/// Runs of a single node, parked at every kind of pull point or done, are
/// exported, imported into a fleet's Postgres, and continue there: the
/// fleet's logs start with the node's, and every run finishes with each
/// refund run at most once across both.
#[test]
fn runs_exported_from_a_single_node_continue_on_the_fleet() {
    let mut fleet = Fleet::new(&mixed_scripts());
    let data = fleet.dir.join("node.db");
    let mut node = Node::new(
        Api {
            server: format!("http://127.0.0.1:{}", glia_testkit::fleet::free_port()),
            ..fleet.api.clone()
        },
        data.clone(),
    );
    node.start();
    let runs = submit_mixed(&node.api, 15, 0);
    // Wait until nothing moves: every run parked or done.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, page) = node.api.get("/v1/runs?limit=100");
        let moving = page["runs"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["status"] == "runnable")
            .count();
        if moving == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "{moving} runs still runnable");
        std::thread::sleep(Duration::from_millis(20));
    }
    let before: HashMap<String, Vec<Value>> = runs
        .iter()
        .map(|(_, id)| (id.clone(), node.api.events(id)))
        .collect();
    node.kill();

    let export = fleet.dir.join("runs.jsonl");
    let glia = |args: &[&str]| {
        let out = Command::new(glia_testkit::bin::glia_bin())
            .args(args)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "glia {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let said = glia(&[
        "export",
        "--data",
        data.to_str().unwrap(),
        "--out",
        export.to_str().unwrap(),
    ]);
    assert!(said.contains("exported 15 run(s)"), "{said}");
    let header: Value = serde_json::from_str(
        std::fs::read_to_string(&export)
            .unwrap()
            .lines()
            .next()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        (header["format"].as_str(), header["version"].as_u64()),
        (
            Some("glia-runs"),
            Some(glia_backends::archive::VERSION.into())
        ),
        "{header}"
    );
    let said = glia(&[
        "import",
        export.to_str().unwrap(),
        "--database-url",
        &fleet.db_url,
    ]);
    assert!(said.contains("imported 15 run(s)"), "{said}");
    let again = glia(&[
        "import",
        export.to_str().unwrap(),
        "--database-url",
        &fleet.db_url,
    ]);
    assert!(
        again.contains("imported 0 run(s)") && again.contains("15 already present"),
        "importing again changes nothing: {again}"
    );

    fleet.start_dispatcher();
    fleet.start_worker(2_000);
    for (id, events) in &before {
        let moved = fleet.events(id);
        assert_eq!(
            &moved[..events.len()],
            &events[..],
            "run {id}: the fleet's log starts with the node's"
        );
    }
    let results = drive_all(&fleet.api, &runs, Instant::now() + Duration::from_secs(120));
    check_batch(&fleet.api, &results);
}
