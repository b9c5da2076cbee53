//! End to end: a `glia worker` process on a real provider (`--provider
//! anthropic` against a local server replaying recorded answers) behind a
//! `glia dispatcher`, on the real Postgres, RabbitMQ and Redis. A 429 with
//! `retry-after` is retried in place and recorded as `model.retry`; the
//! fleet-wide rate limiter keeps its buckets and cooldown in Redis; the
//! worker's price file prices the run.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use glia_proto::{EventKind, Outcome, RunState, Status};
use glia_providers::PriceTable;
use glia_testkit::fleet::*;
use glia_testkit::http::{Reply, Server, fixture};
use serde_json::json;

const PRICES: &str = "../providers/prices.example.json";

#[test]
fn a_worker_on_a_real_provider_retries_a_429_and_shares_the_cooldown_through_redis() {
    let server = Server::background(vec![
        Reply::json(429, fixture("anthropic/error_429.json")).header("retry-after", "1"),
        Reply::sse(fixture("anthropic/loop_turn1.sse")),
        Reply::sse(fixture("anthropic/loop_turn2.sse")),
    ]);
    let mut fleet = Fleet::new(&[]);
    fleet.start_dispatcher();
    let worker = Command::new(glia_testkit::bin::glia_bin())
        .args([
            "worker",
            "--demo",
            "--provider",
            "anthropic",
            "--base-url",
            &server.base,
            "--allow-missing-key",
            "--prices",
            PRICES,
        ])
        .args([
            "--rpm",
            "600",
            "--id",
            "real-provider",
            "--concurrency",
            "2",
        ])
        .current_dir(glia_testkit::workspace_root().join("cli"))
        .env("GLIA_DATABASE_URL", &fleet.db_url)
        .env("GLIA_AMQP_URL", &fleet.amqp_url)
        .env("GLIA_REDIS_URL", &fleet.redis_url)
        .env("GLIA_QUEUE", &fleet.name)
        .env("GLIA_REDIS_PREFIX", &fleet.name)
        .env("RUST_LOG", env_or("GLIA_E2E_LOG", "warn"))
        .env_remove("ANTHROPIC_API_KEY")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .expect("worker starts");
    fleet.workers.push(worker);

    let run_id = fleet.submit(
        "What is 2 + 40?",
        json!({"model": "claude-sonnet-4-5", "max_tokens": 1024}),
    );
    drive(&fleet, &run_id, Instant::now() + Duration::from_secs(120));
    let log = check_log(&fleet, &run_id);
    let state = RunState::replay(log[0].run_id, &log).unwrap();
    assert!(
        matches!(state.status(), Status::Done(Outcome::Succeeded { ref answer, .. }) if answer.contains("42")),
        "{:?}",
        state.status()
    );

    // The 429 was retried inside the first model call and recorded there.
    let names: Vec<&str> = log.iter().map(|e| e.kind.name()).collect();
    let call = names.iter().position(|n| *n == "model.call").unwrap();
    assert_eq!(
        &names[call..call + 3],
        ["model.call", "model.retry", "model.response"],
        "{names:?}"
    );
    let EventKind::ModelRetry(retry) = &log[call + 1].kind else {
        unreachable!()
    };
    assert_eq!((retry.attempt, retry.cause.as_str()), (1, "rate_limited"));
    assert!(retry.delay_ms >= 1000, "retry-after honoured: {retry:?}");
    assert_eq!(server.seen().len(), 3);

    // Priced by the worker's table (the run's config names no prices).
    let pricing = PriceTable::from_file(glia_testkit::workspace_root().join("cli").join(PRICES))
        .unwrap()
        .pricing("anthropic", "claude-sonnet-4-5")
        .unwrap();
    let costs: Vec<(glia_proto::Usage, u64)> = log
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ModelResponse {
                usage,
                cost_usd_micros,
                ..
            } => Some((*usage, *cost_usd_micros)),
            _ => None,
        })
        .collect();
    assert_eq!(costs.len(), 2);
    assert!(
        costs
            .iter()
            .all(|(u, c)| *c > 0 && *c == pricing.cost_usd_micros(u)),
        "{costs:?}"
    );

    // The rate limiter's buckets and the 429's cooldown live in Redis under
    // the fleet's prefix, for every worker to respect.
    let keys = Command::new("redis-cli")
        .args([
            "-u",
            &fleet.redis_url,
            "--scan",
            "--pattern",
            &format!("{}:rl:*", fleet.name),
        ])
        .output()
        .expect("redis-cli runs");
    let keys = String::from_utf8_lossy(&keys.stdout);
    assert!(
        keys.lines()
            .any(|k| k.contains("{anthropic:claude-sonnet-4-5:") && k.ends_with(":bucket")),
        "rate-limit keys: {keys:?}"
    );
    assert!(
        keys.lines()
            .any(|k| k.contains("{anthropic:claude-sonnet-4-5:") && k.ends_with(":cooldown")),
        "rate-limit keys: {keys:?}"
    );
}

/// A run naming a catalogue provider (`"provider": "backup"`) is served by
/// that provider: its base URL, the key from its variable, its own rate
/// limiter buckets in Redis; a run naming none goes to `--provider`. The
/// key reaches no event.
#[test]
fn a_run_naming_a_catalogue_provider_is_served_by_it_with_its_key_and_limits() {
    let default = Server::streams(&["anthropic/loop_turn1.sse", "anthropic/loop_turn2.sse"]);
    let backup = Server::streams(&["anthropic/loop_turn1.sse", "anthropic/loop_turn2.sse"]);
    let mut fleet = Fleet::new(&[]);
    let catalogue = fleet.dir.join("catalogue.toml");
    let toml = format!(
        "[providers.backup]\nkind = \"anthropic\"\nbase_url = \"{}\"\napi_key_env = \"GLIA_TEST_BACKUP_KEY\"\nrequests_per_minute = 600\n",
        backup.base
    );
    std::fs::write(&catalogue, toml).unwrap();
    const SECRET: &str = "sk-backup-7d1f0c";
    fleet.start_dispatcher();
    let worker = fleet
        .command(&[
            "worker",
            "--demo",
            "--provider",
            "anthropic",
            "--base-url",
            &default.base,
            "--allow-missing-key",
            "--id",
            "named",
            "--catalogue",
        ])
        .arg(&catalogue)
        .current_dir(glia_testkit::workspace_root().join("cli"))
        .env("GLIA_TEST_BACKUP_KEY", SECRET)
        .env_remove("ANTHROPIC_API_KEY")
        .spawn()
        .expect("worker starts");
    fleet.workers.push(worker);

    let config = json!({"model": "claude-sonnet-4-5", "max_tokens": 1024, "provider": "backup"});
    let run_id = fleet.submit("What is 2 + 40?", config);
    drive(&fleet, &run_id, Instant::now() + Duration::from_secs(120));
    let log = check_log(&fleet, &run_id);
    let state = RunState::replay(log[0].run_id, &log).unwrap();
    assert!(
        matches!(state.status(), Status::Done(Outcome::Succeeded { ref answer, .. }) if answer.contains("42")),
        "{:?}",
        state.status()
    );
    let seen = backup.seen();
    assert_eq!(
        (seen.len(), default.seen().len()),
        (2, 0),
        "the named provider served both calls"
    );
    assert!(
        seen.iter().all(|s| s.header("x-api-key") == Some(SECRET)),
        "the key came from the catalogue's variable"
    );
    let events = serde_json::to_string(&log).unwrap();
    assert!(!events.contains(SECRET), "the key reached an event");

    let keys = Command::new("redis-cli")
        .args([
            "-u",
            &fleet.redis_url,
            "--scan",
            "--pattern",
            &format!("{}:provider:backup:rl:*", fleet.name),
        ])
        .output()
        .expect("redis-cli runs");
    let keys = String::from_utf8_lossy(&keys.stdout);
    assert!(
        keys.lines().any(|k| k.ends_with(":bucket")),
        "the entry's own rate-limit buckets: {keys:?}"
    );

    // A run naming no provider is the worker's default's.
    let run_id = fleet.submit(
        "What is 2 + 40?",
        json!({"model": "claude-sonnet-4-5", "max_tokens": 1024}),
    );
    drive(&fleet, &run_id, Instant::now() + Duration::from_secs(120));
    check_log(&fleet, &run_id);
    assert_eq!((backup.seen().len(), default.seen().len()), (2, 2));
}
