//! Evals on the fleet (issue 31, `docs/evals.md`): the tau-bench airline
//! recordings as a replay eval (`glia eval dataset tau`, then `glia eval
//! run --server`) on a dispatcher and two workers over Postgres, RabbitMQ
//! and Redis, with a worker and then the dispatcher killed by `kill -9`
//! in the middle of the experiment. It completes with 200 cells, each run
//! once and graded once, every one passing the trajectory grader (exact
//! order, exact arguments).

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use glia_testkit::fleet::{replay_fleet, trajectories};
use serde_json::Value;

fn tempdir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("glia-evals-{}", uuid::Uuid::now_v7().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn tau_replay_eval_completes_on_the_fleet_through_worker_and_dispatcher_kills() {
    let mut fleet = replay_fleet();
    let dir = tempdir();
    let out = Command::new(glia_testkit::bin::glia_bin())
        .args(["eval", "dataset", "tau", &trajectories(), "--out-dir"])
        .arg(&dir)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "glia eval dataset tau: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let child = Command::new(glia_testkit::bin::glia_bin())
        .args(["eval", "run"])
        .arg(dir.join("tau-airline.json"))
        .args([
            "--server",
            &fleet.server,
            "--json",
            "--max-outage-secs",
            "300",
        ])
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(300);
    let wait_for = |fleet: &glia_testkit::fleet::Fleet, done: usize| {
        while fleet.done_runs() < done {
            assert!(
                Instant::now() < deadline,
                "the experiment made no progress: {}",
                fleet.log_tails(30)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    wait_for(&fleet, 40);
    // Kill w1 while it holds a run, so the kill interrupts work.
    while fleet.live_leases_of("w1") == 0 {
        assert!(
            fleet.done_runs() < 200,
            "the experiment ended before w1 held a run"
        );
        assert!(Instant::now() < deadline, "worker w1 never held a run");
        std::thread::sleep(Duration::from_millis(5));
    }
    fleet.kill_and_replace_worker(1, 2_000);
    wait_for(&fleet, 100);
    // The dispatcher tends the experiment (turns, approvals, grades); a new
    // one takes the experiment over when the dead one's claim runs out.
    fleet.restart_dispatcher();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "glia eval run failed: {stderr}\n{}",
        fleet.log_tails(30)
    );
    let exp: Value = serde_json::from_slice(&out.stdout).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(exp["state"], "completed", "{stderr}");
    assert_eq!(
        (
            exp["progress"]["cells"].as_u64(),
            exp["progress"]["graded"].as_u64()
        ),
        (Some(200), Some(200))
    );
    let version = &exp["summary"]["versions"][0];
    assert_eq!(
        (
            version["graded"].as_u64(),
            version["passed"].as_u64(),
            version["errors"].as_u64()
        ),
        (Some(200), Some(200), Some(0)),
        "{version}"
    );
    let cells = exp["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 200);
    let mut runs = BTreeSet::new();
    for cell in cells {
        assert_eq!(cell["pass"], true, "{cell}");
        let verdicts = cell["verdicts"].as_array().unwrap();
        assert_eq!(verdicts.len(), 1, "{cell}");
        assert_eq!(
            (
                verdicts[0]["grader"].as_str(),
                verdicts[0]["score"].as_f64()
            ),
            (Some("trajectory"), Some(1.0)),
            "{cell}"
        );
        assert!(runs.insert(cell["run_id"].as_str().unwrap().to_owned()));
    }
    // Each cell ran once: the experiment's runs are exactly its 200 cells'.
    let id = exp["id"].as_str().unwrap();
    let (status, page) = fleet.get(&format!("/v1/runs?meta=glia.experiment={id}&limit=1000"));
    assert_eq!(status, 200, "{page}");
    let listed: BTreeSet<String> = page["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["run_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(listed, runs);
}
