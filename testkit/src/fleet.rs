//! Process-level fleets: a dispatcher and workers as real `glia` processes
//! against the machine's Postgres, RabbitMQ and Redis (or private instances:
//! [`Fleet::on`] a private cluster, and set [`Fleet::amqp_url`] /
//! [`Fleet::redis_url`] before starting processes), each fleet isolated by
//! its own database, queue name and Redis key prefix, all removed when it is
//! dropped. Each process's stderr is captured in `<dir>/logs/<role>.log`;
//! when a test panics, the fleet prints the last lines of every log and
//! keeps the directory (as it does with `GLIA_KEEP_FLEET_LOGS` set).
//!
//! The client side: submit runs, drive every pull point (approve, answer
//! external tools, reply, close, resume), check each log (no gap, no
//! duplicate, replays) and the refund tool's effects file (each refund at
//! most once; per run exactly one outcome).

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use glia_proto::{EventKind, ToolErrorKind};
use serde_json::{Value, json};
use uuid::Uuid;

/// `$key`, or `default` when unset.
pub fn env_or(key: &str, default: &str) -> String {
    std::env::var(key).unwrap_or_else(|_| default.to_owned())
}

/// The machine's Postgres admin database (`GLIA_DATABASE_URL`).
pub fn admin_url() -> String {
    env_or(
        "GLIA_DATABASE_URL",
        "postgres://postgres@127.0.0.1:5432/postgres",
    )
}

/// The machine's RabbitMQ (`GLIA_AMQP_URL`).
pub fn amqp_url() -> String {
    env_or("GLIA_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2f")
}

/// The machine's Redis (`GLIA_REDIS_URL`).
pub fn redis_url() -> String {
    env_or("GLIA_REDIS_URL", "redis://127.0.0.1:6379")
}

pub use crate::free_port;

/// The HTTP side of a fleet: what a client sees.
#[derive(Clone)]
pub struct Api {
    /// The fleet's name (database, queue and key prefix).
    pub name: String,
    /// The fleet's directory (scripts, effects file, logs).
    pub dir: PathBuf,
    /// The dispatcher's base URL.
    pub server: String,
    /// The bearer token its calls send, when the dispatcher has tokens
    /// (`GLIA_TOKENS`); it must see every run the test reads (scope `admin`).
    pub token: Option<String>,
}

/// One isolated fleet: database, queue, key prefix, scripts, effects file,
/// and the processes started on them. Dropping it kills the processes and
/// removes what it created.
pub struct Fleet {
    /// What a client sees.
    pub api: Api,
    /// The fleet's name (database, queue and key prefix).
    pub name: String,
    /// The Postgres admin database the fleet's database lives beside.
    pub admin_url: String,
    /// The fleet's database.
    pub db_url: String,
    /// The fleet's directory.
    pub dir: PathBuf,
    /// The dispatcher's base URL.
    pub server: String,
    dispatcher_port: u16,
    /// The dispatcher process, when started.
    pub dispatcher: Option<Child>,
    /// The worker processes, by index.
    pub workers: Vec<Child>,
    /// Environment added to every process.
    pub extra_env: Vec<(String, String)>,
    /// The broker the processes use.
    pub amqp_url: String,
    /// The Redis the processes use.
    pub redis_url: String,
    /// Arguments added to every `glia worker` command (e.g. `--replay DIR`).
    pub worker_args: Vec<String>,
    /// Environment added to the processes of one worker slot (after
    /// `extra_env`), e.g. its service URLs routed through a
    /// [`crate::proxy::Partition`].
    pub worker_env: HashMap<usize, Vec<(String, String)>>,
}

/// Run `sql` with `psql` against `url` (stopping at the first error) and
/// answer its unaligned, tuples-only output, trimmed. Panics when `psql`
/// cannot run or the statement fails.
pub fn psql(url: &str, sql: &str) -> String {
    let out = Command::new("psql")
        .args([url, "-v", "ON_ERROR_STOP=1", "-qAtc", sql])
        .output()
        .expect("psql runs");
    assert!(
        out.status.success(),
        "psql {sql}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

fn db_url_for(admin: &str, db: &str) -> String {
    match admin.rsplit_once('/') {
        Some((base, _)) => format!("{base}/{db}"),
        None => format!("{admin}/{db}"),
    }
}

impl Fleet {
    /// How many runs worker `owner` (its `--id`, e.g. `w1`) holds a live
    /// lease on right now, read from the fleet's database.
    pub fn live_leases_of(&self, owner: &str) -> usize {
        let sql = format!(
            "SELECT count(*) FROM runs WHERE lease_owner = '{}' AND lease_expires_at > now()",
            owner.replace('\'', "''")
        );
        psql(&self.db_url, &sql).parse().expect("a count")
    }

    /// Create the database (on the machine's Postgres) and the scripts
    /// directory; start nothing yet.
    pub fn new(scripts: &[(&str, Value)]) -> Fleet {
        Fleet::on(&admin_url(), scripts)
    }

    /// [`Fleet::new`] on the Postgres whose admin database is `admin`
    /// (e.g. a [`crate::PrivatePostgres`]).
    pub fn on(admin: &str, scripts: &[(&str, Value)]) -> Fleet {
        let name = format!("glia_e2e_{}", Uuid::now_v7().simple());
        psql(admin, &format!("CREATE DATABASE {name}"));
        let dir = std::env::temp_dir().join(&name);
        std::fs::create_dir_all(dir.join("scripts")).unwrap();
        std::fs::create_dir_all(dir.join("logs")).unwrap();
        for (script, turns) in scripts {
            std::fs::write(
                dir.join("scripts").join(format!("{script}.json")),
                serde_json::to_vec(turns).unwrap(),
            )
            .unwrap();
        }
        let port = free_port();
        Fleet {
            api: Api {
                name: name.clone(),
                dir: dir.clone(),
                server: format!("http://127.0.0.1:{port}"),
                token: None,
            },
            db_url: db_url_for(admin, &name),
            admin_url: admin.to_owned(),
            name,
            dir,
            server: format!("http://127.0.0.1:{port}"),
            dispatcher_port: port,
            dispatcher: None,
            workers: Vec::new(),
            extra_env: Vec::new(),
            amqp_url: amqp_url(),
            redis_url: redis_url(),
            worker_args: Vec::new(),
            worker_env: HashMap::new(),
        }
    }

    /// `glia ARGS` with the fleet's environment (services, queue, prefix),
    /// stdin and stdout closed, stderr inherited.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(crate::bin::glia_bin());
        cmd.args(args)
            .env("GLIA_DATABASE_URL", &self.db_url)
            .env("GLIA_AMQP_URL", &self.amqp_url)
            .env("GLIA_REDIS_URL", &self.redis_url)
            .env("GLIA_QUEUE", &self.name)
            .env("GLIA_REDIS_PREFIX", &self.name)
            .env("GLIA_DEMO_EFFECTS", self.effects_file())
            .env("RUST_LOG", env_or("GLIA_E2E_LOG", "warn"))
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        for (k, v) in &self.extra_env {
            cmd.env(k, v);
        }
        cmd
    }

    /// Write the operator's catalogue `toml` to `fleet.toml` in the fleet's
    /// directory, and have the workers (`--catalogue`) and the dispatcher
    /// (`GLIA_CATALOGUE`) started after this read it.
    pub fn use_catalogue(&mut self, toml: &str) {
        let path = self.dir.join("fleet.toml");
        std::fs::write(&path, toml).expect("write the catalogue");
        self.worker_args = vec!["--catalogue".into(), path.display().to_string()];
        self.extra_env
            .push(("GLIA_CATALOGUE".into(), path.display().to_string()));
    }

    /// Start the dispatcher and wait until it is ready (`/readyz` 200).
    pub fn start_dispatcher(&mut self) {
        self.spawn_dispatcher();
        wait_status(
            &format!("{}/readyz", self.server),
            200,
            Duration::from_secs(60),
        );
    }

    /// `glia ARGS` like [`Fleet::command`], stderr appended to
    /// `<dir>/logs/<role>.log`.
    pub fn logged(&self, role: &str, args: &[&str]) -> Command {
        let mut cmd = self.command(args);
        let log = std::fs::File::options()
            .create(true)
            .append(true)
            .open(self.log_file(role))
            .expect("open the process log");
        cmd.stderr(log);
        cmd
    }

    /// Where [`Fleet::logged`] writes `role`'s stderr.
    pub fn log_file(&self, role: &str) -> PathBuf {
        self.dir.join("logs").join(format!("{role}.log"))
    }

    /// Start the dispatcher without waiting for it.
    pub fn spawn_dispatcher(&mut self) {
        let listen = format!("127.0.0.1:{}", self.dispatcher_port);
        let child = self
            .logged(
                "dispatcher",
                &["dispatcher", "--listen", &listen, "--reconcile-every", "1"],
            )
            .spawn()
            .expect("dispatcher starts");
        self.dispatcher = Some(child);
    }

    /// `kill -9` the dispatcher, then start a new one on the same address
    /// and wait until it is ready.
    pub fn restart_dispatcher(&mut self) {
        let mut old = self.dispatcher.take().expect("a dispatcher runs");
        old.kill().expect("kill -9 the dispatcher");
        old.wait().unwrap();
        self.start_dispatcher();
    }

    /// Start one more worker process.
    pub fn start_worker(&mut self, lease_ms: u64) {
        let scripts = self.dir.join("scripts");
        let id = format!("w{}", self.workers.len());
        let child = self
            .logged(
                &id,
                &[
                    "worker",
                    "--demo",
                    "--scripts",
                    scripts.to_str().unwrap(),
                    "--lease-ms",
                    &lease_ms.to_string(),
                    "--concurrency",
                    "8",
                    "--id",
                    &id,
                ],
            )
            .args(&self.worker_args)
            .envs(
                self.worker_env
                    .get(&self.workers.len())
                    .into_iter()
                    .flatten()
                    .map(|(k, v)| (k, v)),
            )
            .spawn()
            .expect("worker starts");
        self.workers.push(child);
    }

    /// `kill -9` worker `i` and start a replacement in its place.
    pub fn kill_and_replace_worker(&mut self, i: usize, lease_ms: u64) {
        let fresh = self.spawn_worker_child(i, lease_ms);
        let mut old = std::mem::replace(&mut self.workers[i], fresh);
        let _ = old.kill();
        let _ = old.wait();
    }

    fn spawn_worker_child(&self, i: usize, lease_ms: u64) -> Child {
        let scripts = self.dir.join("scripts");
        self.logged(
            &format!("w{i}"),
            &[
                "worker",
                "--demo",
                "--scripts",
                scripts.to_str().unwrap(),
                "--lease-ms",
                &lease_ms.to_string(),
                "--concurrency",
                "8",
                "--id",
                &format!("w{i}-{}", Uuid::now_v7().simple()),
            ],
        )
        .args(&self.worker_args)
        .envs(
            self.worker_env
                .get(&i)
                .into_iter()
                .flatten()
                .map(|(k, v)| (k, v)),
        )
        .spawn()
        .expect("worker starts")
    }

    /// `kill -9` worker `i` without replacing it (see [`Fleet::replace_worker`]).
    pub fn kill_worker(&mut self, i: usize) {
        let _ = self.workers[i].kill();
        let _ = self.workers[i].wait();
    }

    /// Start a fresh worker process in slot `i` (after [`Fleet::kill_worker`]).
    pub fn replace_worker(&mut self, i: usize, lease_ms: u64) {
        self.workers[i] = self.spawn_worker_child(i, lease_ms);
    }

    /// `kill -9` the dispatcher without restarting it.
    pub fn kill_dispatcher(&mut self) {
        if let Some(mut d) = self.dispatcher.take() {
            let _ = d.kill();
            let _ = d.wait();
        }
    }

    /// Send `signal` (e.g. `"STOP"`, `"CONT"`) to worker `i`.
    pub fn signal_worker(&self, i: usize, signal: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{signal}"), &self.workers[i].id().to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill -{signal} worker {i}");
    }

    /// The last `lines` lines of every process log, for failure messages.
    pub fn log_tails(&self, lines: usize) -> String {
        let mut out = String::new();
        let mut files: Vec<PathBuf> = std::fs::read_dir(self.dir.join("logs"))
            .map(|d| d.filter_map(|e| Some(e.ok()?.path())).collect())
            .unwrap_or_default();
        files.sort();
        for f in files {
            out.push_str(&format!(
                "--- {} ---\n{}\n",
                f.display(),
                crate::isolation::tail(&f, lines)
            ));
        }
        out
    }
}

impl std::ops::Deref for Fleet {
    type Target = Api;
    fn deref(&self) -> &Api {
        &self.api
    }
}

impl Api {
    /// The demo refund tool's effects file (`GLIA_DEMO_EFFECTS`): one line
    /// `refund <idempotency key>` per execution.
    pub fn effects_file(&self) -> PathBuf {
        self.dir.join("effects.log")
    }

    /// POST JSON to the dispatcher: `(status, body)`.
    pub fn post(&self, path: &str, body: Value) -> (u16, Value) {
        http_as(
            "POST",
            &format!("{}{path}", self.server),
            Some(body),
            self.token.as_deref(),
        )
        .expect("dispatcher answers")
    }

    /// GET from the dispatcher: `(status, body)`.
    pub fn get(&self, path: &str) -> (u16, Value) {
        http_as(
            "GET",
            &format!("{}{path}", self.server),
            None,
            self.token.as_deref(),
        )
        .expect("dispatcher answers")
    }

    /// Create a run; returns its id.
    pub fn submit(&self, goal: &str, config: Value) -> String {
        let (status, body) = self.post("/v1/runs", json!({ "goal": goal, "config": config }));
        assert!(
            status == 201 || status == 200,
            "create run: {status} {body}"
        );
        body["run_id"].as_str().expect("run_id").to_owned()
    }

    /// All events of a run.
    pub fn events(&self, run_id: &str) -> Vec<Value> {
        let (status, body) = self.get(&format!("/v1/runs/{run_id}/events?after=0&limit=1000"));
        assert_eq!(status, 200, "{body}");
        body["events"]
            .as_array()
            .or(body.as_array())
            .cloned()
            .unwrap_or_default()
    }

    /// Lines of the effects file.
    pub fn effects(&self) -> Vec<String> {
        std::fs::read_to_string(self.effects_file())
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// How many runs are done (the fleet's database holds only its runs).
    pub fn done_runs(&self) -> usize {
        let (status, body) = self.get("/v1/runs?status=done&limit=1000");
        assert_eq!(status, 200, "{body}");
        body["runs"].as_array().map_or(0, Vec::len)
    }

    /// The value of an unlabelled metric of the dispatcher's `/metrics`
    /// (e.g. `glia_dispatcher_relay_errors_total`); 0 when absent.
    pub fn metric(&self, name: &str) -> f64 {
        let (status, body) = self.get("/metrics");
        assert_eq!(status, 200, "{body}");
        let text = body.as_str().unwrap_or_default();
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
            .unwrap_or(0.0)
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("fleet {} logs:\n{}", self.name, self.log_tails(30));
        }
        for mut c in self.workers.drain(..).chain(self.dispatcher.take()) {
            let _ = c.kill();
            let _ = c.wait();
        }
        let drop = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name);
        let _ = Command::new("psql")
            .args([&self.admin_url, "-qAtc", &drop])
            .output();
        delete_queue_topology(&self.amqp_url, &self.name);
        let _ = Command::new("sh")
            .arg("-c")
            .arg(format!("redis-cli -u '{}' --scan --pattern '{}*' | xargs -r redis-cli -u '{}' del >/dev/null", self.redis_url, self.name, self.redis_url))
            .status();
        if std::thread::panicking() || std::env::var_os("GLIA_KEEP_FLEET_LOGS").is_some() {
            eprintln!(
                "fleet {}: logs kept in {}",
                self.name,
                self.dir.join("logs").display()
            );
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Delete the fleet's queue, dead-letter queue and exchange on the broker
/// at `url` (whichever broker the fleet used), on a thread and runtime of its
/// own; a broker that is gone is ignored.
fn delete_queue_topology(url: &str, queue: &str) {
    use glia_backends::rabbitmq::{QueueOptions, RabbitQueue};
    let (url, mut opts) = (url.to_owned(), QueueOptions::new(queue));
    opts.publish_attempts = 1;
    opts.connect_timeout = Duration::from_secs(5);
    let done = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            if let Ok(q) = RabbitQueue::connect(&url, opts).await {
                if let Err(e) = q.delete_topology().await {
                    eprintln!("cleanup of queue {}: {e}", q.options().queue);
                }
                q.close().await;
            }
        })
    });
    let _ = done.join();
}

/// Poll `url` until it answers `status` (panics after `timeout` with the
/// last answer).
pub fn wait_status(url: &str, status: u16, timeout: Duration) -> Value {
    let deadline = Instant::now() + timeout;
    loop {
        let answer = http("GET", url, None);
        match &answer {
            Ok((s, body)) if *s == status => return body.clone(),
            _ => assert!(
                Instant::now() < deadline,
                "{url} did not answer {status} within {timeout:?}: {answer:?}"
            ),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A blocking JSON HTTP call: `(status, body)`.
pub fn http(method: &str, url: &str, body: Option<Value>) -> Result<(u16, Value), String> {
    http_as(method, url, body, None)
}

/// [`http`] with a bearer token, when given.
pub fn http_as(
    method: &str,
    url: &str,
    body: Option<Value>,
    token: Option<&str>,
) -> Result<(u16, Value), String> {
    let client = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .map_err(|e| e.to_string())?;
    let mut req = client.request(method.parse().unwrap(), url);
    if let Some(b) = body {
        req = req.json(&b);
    }
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let resp = req.send().map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    let text = resp.text().map_err(|e| e.to_string())?;
    Ok((
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    ))
}

/// The vendored tau-bench airline recording (`examples/tau-bench-airline`).
pub fn recording_dir() -> PathBuf {
    crate::workspace_root().join("examples/tau-bench-airline")
}

/// A fleet replaying [`recording_dir`]: a dispatcher and two `--replay`
/// workers (2 s leases), started and ready.
pub fn replay_fleet() -> Fleet {
    let mut fleet = Fleet::new(&[]);
    fleet.worker_args = vec!["--replay".into(), recording_dir().to_str().unwrap().into()];
    fleet.start_dispatcher();
    fleet.start_worker(2_000);
    fleet.start_worker(2_000);
    fleet
}

/// The scripts of the mixed batch, by name.
pub fn mixed_scripts() -> Vec<(&'static str, Value)> {
    vec![
        (
            "plain",
            json!([{"tool_calls": [{"name": "calculator", "input": {"op": "add", "a": 2, "b": 3}}]}, {"text": "5"}]),
        ),
        (
            "approval",
            json!([{"tool_calls": [{"name": "get_order", "input": {"order_id": "A1"}}]}, {"tool_calls": [{"name": "refund_order", "input": {"order_id": "A1"}}]}, {"text": "Refunded."}]),
        ),
        (
            "external",
            json!([{"tool_calls": [{"name": "ask_customer", "input": {"question": "Which order?"}}]}, {"text": "Thanks."}]),
        ),
        (
            "chat",
            json!([{"text": "How can I help?"}, {"text": "Done, goodbye."}]),
        ),
        (
            "budget",
            json!([{"tool_calls": [{"name": "calculator", "input": {"op": "mul", "a": 6, "b": 7}}]}, {"text": "42"}]),
        ),
    ]
}

/// The config for a run of script `name` in the mixed batch.
pub fn mixed_config(name: &str) -> Value {
    let mut c = json!({
        "model": format!("script:{name}"),
        "policies": [{"tool": "refund_order", "action": {"kind": "require_approval"}}],
        "external_tools": [{"name": "ask_customer", "description": "Ask the customer.", "input_schema": {"type": "object"}, "external": true}],
    });
    match name {
        "chat" => c["conversational"] = json!(true),
        "budget" => c["budget"] = json!({"max_turns": 1}),
        _ => {}
    }
    c
}

/// Post whatever the run waits for until it is done; returns the final run.
/// `chat` runs get one reply and are then closed.
pub fn drive(fleet: &Api, run_id: &str, deadline: Instant) -> Value {
    let mut replies = 0;
    let mut last_posted: HashMap<String, Instant> = HashMap::new();
    loop {
        assert!(
            Instant::now() < deadline,
            "run {run_id} did not finish: {}",
            fleet.get(&format!("/v1/runs/{run_id}")).1
        );
        let (status, run) = fleet.get(&format!("/v1/runs/{run_id}"));
        assert_eq!(status, 200, "{run}");
        if run["status"] == "done" {
            return run;
        }
        if run["status"] != "parked" {
            std::thread::sleep(Duration::from_millis(20));
            continue;
        }
        let pp = &run["pull_point"];
        let key = format!("{}:{}", run["head_seq"], pp);
        if last_posted
            .get(&key)
            .is_some_and(|t| t.elapsed() < Duration::from_secs(5))
        {
            std::thread::sleep(Duration::from_millis(20));
            continue;
        }
        let (path, body) = match pp["kind"].as_str().unwrap_or("") {
            "awaiting_approval" => (
                format!(
                    "/v1/runs/{run_id}/approvals/{}",
                    pp["call_ids"][0].as_str().unwrap()
                ),
                json!({"decision": "approve"}),
            ),
            "awaiting_tool" => (
                format!(
                    "/v1/runs/{run_id}/tool-results/{}",
                    pp["call_ids"][0].as_str().unwrap()
                ),
                json!({"content": "Order A1."}),
            ),
            "awaiting_input" if replies == 0 => {
                replies += 1;
                (
                    format!("/v1/runs/{run_id}/messages"),
                    json!({"text": "Refund A1, please."}),
                )
            }
            "awaiting_input" => (format!("/v1/runs/{run_id}/close"), json!({})),
            "paused" => (
                format!("/v1/runs/{run_id}/resume"),
                json!({"extend": {"max_turns": 5}}),
            ),
            other => panic!("unknown pull point {other}"),
        };
        let (status, answer) = fleet.post(&path, body);
        assert!(status < 300 || status == 409, "{path}: {status} {answer}");
        last_posted.insert(key, Instant::now());
    }
}

/// Every event log is gap- and duplicate-free and replays.
pub fn check_log(fleet: &Api, run_id: &str) -> Vec<glia_proto::Event> {
    let events: Vec<glia_proto::Event> = fleet
        .events(run_id)
        .into_iter()
        .map(|v| serde_json::from_value(v).expect("event parses"))
        .collect();
    for (i, e) in events.iter().enumerate() {
        assert_eq!(
            e.seq,
            i as u64 + 1,
            "run {run_id}: seq {} at position {i}",
            e.seq
        );
    }
    glia_proto::RunState::replay(events[0].run_id, &events)
        .unwrap_or_else(|e| panic!("run {run_id} does not replay: {e}"));
    events
}

/// The kinds of run a mixed batch cycles through (see [`mixed_scripts`]).
pub const KINDS: [&str; 5] = ["plain", "approval", "external", "chat", "budget"];

/// Submit one run of `kind` (numbered `i` in its goal); returns its id.
pub fn submit_kind(fleet: &Api, kind: &str, i: usize) -> String {
    fleet.submit(&format!("{kind} #{i}"), mixed_config(kind))
}

/// Submit `n` runs cycling through the kinds and drive them all from a few
/// client threads; returns `(kind, run_id, final run)`.
pub fn batch(fleet: &Api, n: usize, deadline: Instant) -> Vec<(String, String, Value)> {
    let runs: Vec<(String, String)> = (0..n)
        .map(|i| {
            let kind = KINDS[i % KINDS.len()];
            (kind.to_owned(), submit_kind(fleet, kind, i))
        })
        .collect();
    drive_all(fleet, &runs, deadline)
}

/// Drive `runs` (`(kind, run_id)`) to the end from a few client threads;
/// returns `(kind, run_id, final run)`.
pub fn drive_all(
    fleet: &Api,
    runs: &[(String, String)],
    deadline: Instant,
) -> Vec<(String, String, Value)> {
    let results = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for chunk in runs.chunks(runs.len().div_ceil(8).max(1)) {
            let results = &results;
            s.spawn(move || {
                for (kind, run_id) in chunk {
                    let run = drive(fleet, run_id, deadline);
                    results
                        .lock()
                        .unwrap()
                        .push((kind.clone(), run_id.clone(), run));
                }
            });
        }
    });
    results.into_inner().unwrap()
}

/// The checks every batch ends with: all completed as expected, logs without
/// gaps or duplicates, each refund executed at most once (by the tool's own
/// effects file), and per approval run exactly one outcome in the log: a
/// result whose refund the effects file shows, or an outcome-unknown error (a
/// kill between the refund and its recorded result leaves the effect *and*
/// the outcome-unknown error: the run could not know, and says so). Returns
/// how often each refund ran.
pub fn check_batch(fleet: &Api, results: &[(String, String, Value)]) -> HashMap<String, usize> {
    let mut refunds: HashMap<String, usize> = HashMap::new();
    for line in fleet.effects() {
        *refunds.entry(line).or_default() += 1;
    }
    for (key, n) in &refunds {
        assert_eq!(*n, 1, "{key} executed {n} times");
        assert!(
            !key.starts_with("replay "),
            "{key}: the refund was delivered a second time (no run here asks to re-run an interrupted call)"
        );
    }
    for (kind, run_id, run) in results {
        assert_eq!(
            run["outcome"]["kind"], "succeeded",
            "{kind} run {run_id}: {run}"
        );
        let events = check_log(fleet, run_id);
        let unknown = events
            .iter()
            .filter(|e| {
                matches!(
                    e.kind,
                    EventKind::ToolError {
                        error: ToolErrorKind::OutcomeUnknown,
                        ..
                    }
                )
            })
            .count();
        let recorded: Vec<String> = events
            .iter()
            .filter_map(|e| match &e.kind {
                EventKind::ToolResult { content, .. } => {
                    serde_json::from_str::<Value>(&content.to_text()).ok()
                }
                _ => None,
            })
            .filter(|v| v["refunded"] == true)
            .map(|v| v["idempotency_key"].as_str().unwrap_or_default().to_owned())
            .collect();
        for key in &recorded {
            assert!(
                refunds.contains_key(&format!("refund {key}")),
                "run {run_id}: a result is recorded for refund {key}, which never ran"
            );
        }
        let executed = refunds
            .keys()
            .filter(|k| k.contains(run_id.as_str()))
            .count();
        if kind == "approval" {
            assert_eq!(
                recorded.len() + unknown,
                1,
                "run {run_id}: the refund has {} results and {unknown} outcome-unknown errors",
                recorded.len()
            );
            assert!(executed <= 1, "run {run_id}: {executed} refunds ran");
        } else {
            assert_eq!(executed, 0, "{kind} run {run_id} ran a refund");
        }
    }
    refunds
}

// ---------------------------------------------------------------------------
// The tau-bench recording and `glia batch`

/// The recording's trajectories file.
pub fn trajectories() -> String {
    recording_dir()
        .join("gpt-4o-airline.json")
        .to_str()
        .unwrap()
        .to_owned()
}

/// `glia batch --json ARGS…` on the vendored recording, output piped.
pub fn glia_batch(args: &[&str]) -> Command {
    let mut cmd = Command::new(crate::bin::glia_bin());
    cmd.arg("batch")
        .arg(trajectories())
        .arg("--json")
        .args(args)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// The JSON summary `glia batch --json` printed (panics with stderr when it failed).
pub fn summary(out: std::process::Output) -> Value {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "glia batch failed: {}\n{stderr}",
        out.status
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "summary is not JSON ({e}): {}\n{stderr}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// The totals of the recording: every conversation, model turn, tool call,
/// approval (consequential calls) and customer message, reproduced (the
/// approval latency, which a resumed batch may not see, is not checked).
pub fn assert_whole_recording(s: &Value) {
    assert_eq!(s["runs"], 200, "{s}");
    assert_eq!(s["reproduced"], 200, "{s}");
    assert_eq!(s["diverged"], 0, "{s}");
    assert_eq!(s["failed"], 0, "{s}");
    assert_eq!(s["model_calls"], 2454, "{s}");
    assert_eq!(s["tool_calls"], 1164, "{s}");
    assert_eq!(s["tool_results"], 1164, "{s}");
    // A worker killed while an approved consequential call ran asks again
    // (`on_interrupted_call`); every approval beyond the recording's 250
    // must be such a re-approval, and each call still has one result.
    let approvals = s["approvals"].as_u64().unwrap();
    let interrupted = s["interrupted_approvals"].as_u64().unwrap();
    assert_eq!(approvals - interrupted, 250, "{s}");
    assert_eq!(s["customer_turns"], 1290, "{s}");
}

/// `glia dev ARGS --listen ADDR` as a process on a free port, in the
/// workspace root, waited for until `/healthz` answers; killed when dropped.
pub struct Dev {
    child: Child,
    /// Its base URL, `http://127.0.0.1:PORT`.
    pub server: String,
}

impl Dev {
    /// Start it with `args` after `dev` (e.g. `["--demo"]`, `["--replay", DIR]`).
    pub fn start(args: &[&str]) -> Dev {
        let port = free_port();
        let server = format!("http://127.0.0.1:{port}");
        let listen = format!("127.0.0.1:{port}");
        let child = Command::new(crate::bin::glia_bin())
            .current_dir(crate::workspace_root())
            .arg("dev")
            .args(args)
            .args(["--listen", &listen])
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let dev = Dev { child, server };
        let deadline = Instant::now() + Duration::from_secs(30);
        while http("GET", &format!("{}/healthz", dev.server), None).is_err() {
            assert!(Instant::now() < deadline, "glia dev did not come up");
            std::thread::sleep(Duration::from_millis(20));
        }
        dev
    }
}

impl Drop for Dev {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
