//! `glia bench` keeps working: each benchmark, tiny, on the real services,
//! prints the JSON BENCHMARKS.md is made of, with sane values.

use std::process::{Command, Stdio};

use serde_json::Value;

fn bench(args: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_glia"))
        .arg("bench")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "glia bench {args:?} failed: {stderr}");
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}\n{stderr}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

#[test]
fn steps_growth_and_memory_report_measurements() {
    let s = bench(&[
        "steps",
        "--runs",
        "6",
        "--turns",
        "3",
        "--repeat",
        "1",
        "--raw-seconds",
        "1",
        "--concurrency",
        "4",
    ]);
    let m = &s["median"];
    assert_eq!(m["steps"], 6 * (2 * 3 + 1), "{s}"); // per run: 4 model calls and 3 tool results
    assert!(m["steps_per_s"].as_f64().unwrap() > 0.0, "{s}");
    assert!(m["approval_resume_p50_ms"].as_f64().unwrap() > 0.0, "{s}");
    assert!(
        m["raw_inserts_per_s_1"].as_f64().unwrap() > 0.0
            && m["raw_inserts_per_s_c"].as_f64().unwrap() > 0.0,
        "{s}"
    );
    assert_eq!(s["raw_concurrency"], 6, "{s}");
    assert_eq!(s["variant"], "group", "{s}");
    // The ceiling beside them: the same runs' writes, nothing else.
    assert!(
        m["writes_alone_steps_per_s"].as_f64().unwrap() > 0.0
            && s["writes_alone_ratio"].as_f64().unwrap() > 0.0,
        "{s}"
    );

    // Variants side by side: one result each, the same work done by each.
    let s = bench(&[
        "steps",
        "--runs",
        "4",
        "--turns",
        "2",
        "--repeat",
        "1",
        "--raw-seconds",
        "1",
        "--concurrency",
        "4",
        "--variants",
        "transaction,statement,group",
    ]);
    let variants: Vec<&str> = s
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["variant"].as_str().unwrap())
        .collect();
    assert_eq!(variants, ["transaction", "statement", "group"], "{s}");
    for v in s.as_array().unwrap() {
        assert_eq!(v["median"]["steps"], 4 * (2 * 2 + 1), "{s}");
        assert!(v["ratio_to_raw"].as_f64().unwrap() > 0.0, "{s}");
    }

    // The single node, on a SQLite file of its own, in the same shape.
    let s = bench(&[
        "steps",
        "--target",
        "sqlite",
        "--runs",
        "6",
        "--turns",
        "3",
        "--repeat",
        "1",
        "--raw-seconds",
        "1",
        "--concurrency",
        "4",
    ]);
    let m = &s["median"];
    assert_eq!(m["steps"], 6 * (2 * 3 + 1), "{s}");
    assert!(
        m["steps_per_s"].as_f64().unwrap() > 0.0
            && m["approval_resume_p50_ms"].as_f64().unwrap() > 0.0,
        "{s}"
    );
    assert!(
        m["raw_inserts_per_s_1"].as_f64().unwrap() > 0.0
            && m["raw_inserts_per_s_c"].as_f64().unwrap() > 0.0,
        "{s}"
    );
    assert_eq!(m["writes_alone_steps_per_s"], 0.0, "{s}");

    let g = bench(&["growth", "--turns", "30", "--window", "4"]);
    assert_eq!(g["commits"], 2 * 30 + 2, "{g}");
    for k in [
        "early_commit_ms",
        "late_commit_ms",
        "early_wal_bytes",
        "late_wal_bytes",
        "early_event_bytes",
        "late_event_bytes",
    ] {
        assert!(g[k].as_f64().unwrap() > 0.0, "{k}: {g}");
    }

    let mem = bench(&["memory", "--runs", "4", "--tool-ms", "300"]);
    assert!(mem["idle_rss_mib"].as_f64().unwrap() > 1.0, "{mem}");
    assert!(
        mem["peak_rss_mib"].as_f64().unwrap() >= mem["idle_rss_mib"].as_f64().unwrap(),
        "{mem}"
    );
}
