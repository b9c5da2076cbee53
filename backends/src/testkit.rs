//! Test support, not used by glia itself: private RabbitMQ nodes and
//! private `redis-server`s that a test can stop, kill and start again
//! without touching the machine's own services.
//!
//! Both are guards: dropping one kills its process and removes its
//! temporary directory, also when the test panicked. Starting one again after
//! [`stop`](PrivateRabbit::stop) or [`kill`](PrivateRabbit::kill) restarts it
//! on the same ports (and, for RabbitMQ, the same node name and data), so
//! clients configured with its [`url`](PrivateRabbit::url) can reconnect.
//!
//! Waiting (`wait_ready`, `stop`, `queue_stats`) is async; `start`, `kill`
//! and `Drop` return at once. From a synchronous test, run the async ones on
//! a Tokio runtime of its own (`Runtime::block_on`).
//!
//! Only a test binary that is itself killed (SIGKILL, not a panic) leaves its
//! servers running and their directories (`glia-rabbit-*`, `glia-redis-*`
//! in the temporary directory) behind.

use std::fs::File;
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties};
use uuid::Uuid;

/// A TCP port on 127.0.0.1 that nothing listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .expect("bind an ephemeral port")
        .local_addr()
        .expect("its address")
        .port()
}

/// The last `lines` lines of a text file (empty when it cannot be read).
pub fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// SIGTERM (`signal` "TERM") or SIGKILL ("KILL") to a pid, or to a process
/// group with a negative id, through kill(1) (no libc dependency).
fn signal(signal: &str, target: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg("--")
        .arg(target)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// True while the process in `slot` runs.
fn running(slot: &mut Option<Child>) -> bool {
    slot.as_mut()
        .is_some_and(|c| c.try_wait().ok().flatten().is_none())
}

/// SIGTERM the process in `slot` and wait up to `grace` for it to exit.
/// True (and the slot emptied) when it did, or there was none.
async fn terminate(slot: &mut Option<Child>, grace: Duration) -> bool {
    let Some(child) = slot.as_mut() else {
        return true;
    };
    signal("TERM", &child.id().to_string());
    let deadline = Instant::now() + grace;
    while child.try_wait().ok().flatten().is_none() {
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    *slot = None;
    true
}

/// Messages ready and consumers attached on a queue (a passive declare).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueStats {
    /// Messages ready for delivery (not counting unacked ones).
    pub messages: u32,
    /// Consumers attached.
    pub consumers: u32,
}

/// A RabbitMQ node of a test's own: node name `glia-test-<id>@localhost`,
/// free AMQP and distribution ports, and its config, Erlang cookie (`HOME`),
/// data and logs in a temporary directory `glia-rabbit-<id>`. It shares only
/// the machine's epmd; the machine's default node is never touched.
///
/// The `rabbitmq-server` script is run directly, in a process group of its
/// own (the Debian wrapper in /usr/sbin switches to the `rabbitmq` user and
/// its home, which a private node must not use). A node takes 10–20 s to
/// boot.
///
/// Caveat (RabbitMQ 3.10): a node SIGKILLed within about three minutes of
/// declaring a quorum queue may come back without that queue's messages (see
/// [`crate::rabbitmq`]). Use [`PrivateRabbit::stop`] for a restart that
/// keeps them.
///
/// Dropping it kills the node and removes its directory, unless
/// `GLIA_TEST_KEEP_BROKER` is set (then both are left for inspection and
/// their whereabouts printed).
pub struct PrivateRabbit {
    script: PathBuf,
    dir: PathBuf,
    node: String,
    port: u16,
    dist_port: u16,
    child: Option<Child>,
}

impl PrivateRabbit {
    /// The `rabbitmq-server` start script, if RabbitMQ is installed.
    pub fn script() -> Option<PathBuf> {
        let candidates = [
            "/usr/lib/rabbitmq/bin/rabbitmq-server",
            "/usr/local/sbin/rabbitmq-server",
            "/usr/sbin/rabbitmq-server",
        ];
        candidates.iter().map(PathBuf::from).find(|p| p.exists())
    }

    /// A node, not started yet, with its directory and config written.
    /// `None` when RabbitMQ is not installed (a test then skips, loudly).
    pub fn new() -> Option<PrivateRabbit> {
        let script = PrivateRabbit::script()?;
        let id = Uuid::now_v7().simple().to_string();
        let dir = std::env::temp_dir().join(format!("glia-rabbit-{id}"));
        std::fs::create_dir_all(dir.join("log")).expect("create the node's directory");
        let (port, dist_port) = (free_port(), free_port());
        let write = |name: &str, text: String| {
            std::fs::write(dir.join(name), text).expect("write the node's config")
        };
        write(
            "rabbitmq.conf",
            format!("listeners.tcp.local = 127.0.0.1:{port}\n"),
        );
        // An empty env file, so the system's rabbitmq-env.conf is not read.
        write("rabbitmq-env.conf", String::new());
        write("enabled_plugins", "[].\n".into());
        let node = format!("glia-test-{}@localhost", &id[id.len() - 12..]);
        Some(PrivateRabbit {
            script,
            dir,
            node,
            port,
            dist_port,
            child: None,
        })
    }

    /// `amqp://guest:guest@127.0.0.1:<port>/%2f`.
    pub fn url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.port)
    }

    /// The Erlang node name.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// The AMQP port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The node's directory (config, `mnesia/` data, `log/`, `server.out`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The last lines of the node's console output, for failure messages.
    pub fn output_tail(&self) -> String {
        tail(&self.dir.join("server.out"), 40)
    }

    /// Start the node (or start it again, on the same name, ports and data)
    /// without waiting for it; see [`PrivateRabbit::wait_ready`]. Does
    /// nothing when it is already running.
    pub fn start(&mut self) -> std::io::Result<()> {
        if self.is_running() {
            return Ok(());
        }
        let out = File::options()
            .create(true)
            .append(true)
            .open(self.dir.join("server.out"))?;
        let err = out.try_clone()?;
        let d = |p: &str| self.dir.join(p);
        let child = Command::new(&self.script)
            .current_dir(&self.dir)
            .env("HOME", &self.dir)
            .env("RABBITMQ_CONF_ENV_FILE", d("rabbitmq-env.conf"))
            .env("RABBITMQ_NODENAME", &self.node)
            .env("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1")
            .env("RABBITMQ_NODE_PORT", self.port.to_string())
            .env("RABBITMQ_DIST_PORT", self.dist_port.to_string())
            .env("RABBITMQ_CONFIG_FILE", d("rabbitmq.conf"))
            .env("RABBITMQ_ADVANCED_CONFIG_FILE", d("advanced.config"))
            .env("RABBITMQ_ENABLED_PLUGINS_FILE", d("enabled_plugins"))
            .env("RABBITMQ_MNESIA_BASE", d("mnesia"))
            .env("RABBITMQ_LOG_BASE", d("log"))
            .env("RABBITMQ_PID_FILE", d("node.pid"))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            // Its own process group, so the script and its Erlang VM die together.
            .process_group(0)
            .spawn()?;
        self.child = Some(child);
        Ok(())
    }

    /// True while the node's start script runs.
    pub fn is_running(&mut self) -> bool {
        running(&mut self.child)
    }

    /// Poll until the node accepts an AMQP connection.
    ///
    /// # Panics
    ///
    /// When the node exits or is not ready within `timeout`, with the tail
    /// of its console output.
    pub async fn wait_ready(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let attempt = tokio::time::timeout(
                Duration::from_secs(5),
                Connection::connect(&self.url(), ConnectionProperties::default()),
            )
            .await;
            if let Ok(Ok(conn)) = attempt {
                let _ = conn.close(200, "ready".into()).await;
                return;
            }
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!(
                    "private rabbitmq node {} exited with {status}:\n{}",
                    self.node,
                    self.output_tail()
                );
            }
            assert!(
                self.child.is_some(),
                "private rabbitmq node {} was not started",
                self.node
            );
            assert!(
                Instant::now() < deadline,
                "private rabbitmq node {} not ready within {timeout:?}:\n{}",
                self.node,
                self.output_tail()
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Stop the node the way `rabbitmqctl stop` or a service manager does:
    /// SIGTERM to the start script, which shuts the Erlang VM down cleanly
    /// (queues and confirmed messages are kept). Waits up to 60 s, then
    /// kills it.
    pub async fn stop(&mut self) {
        if !terminate(&mut self.child, Duration::from_secs(60)).await {
            eprintln!(
                "private rabbitmq node {} did not stop within 60s; killing it",
                self.node
            );
            self.kill();
        }
    }

    /// SIGKILL the node's whole process group (the script and its VM) and
    /// reap it. See the caveat on the type about quorum queues.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            signal("KILL", &format!("-{}", child.id()));
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Messages ready and consumers attached on `queue` of this node.
    pub async fn queue_stats(&self, queue: &str) -> Result<QueueStats, String> {
        let conn = tokio::time::timeout(
            Duration::from_secs(5),
            Connection::connect(&self.url(), ConnectionProperties::default()),
        )
        .await
        .map_err(|_| "connect: no answer within 5s".to_owned())?
        .map_err(|e| format!("connect: {e}"))?;
        let result = async {
            let ch = conn
                .create_channel()
                .await
                .map_err(|e| format!("open channel: {e}"))?;
            let passive = QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            };
            let q = ch
                .queue_declare(queue.into(), passive, FieldTable::default())
                .await
                .map_err(|e| format!("queue {queue}: {e}"))?;
            Ok(QueueStats {
                messages: q.message_count(),
                consumers: q.consumer_count(),
            })
        }
        .await;
        let _ = conn.close(200, "done".into()).await;
        result
    }
}

impl Drop for PrivateRabbit {
    fn drop(&mut self) {
        if std::env::var_os("GLIA_TEST_KEEP_BROKER").is_some() {
            eprintln!(
                "GLIA_TEST_KEEP_BROKER: leaving node {} (pid {:?}) and {}",
                self.node,
                self.child.as_ref().map(Child::id),
                self.dir.display()
            );
            return;
        }
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A `redis-server` of a test's own on a free port of 127.0.0.1, without
/// persistence (a restart loses every key), in a temporary directory
/// `glia-redis-<id>`.
///
/// Dropping it kills the server and removes the directory.
pub struct PrivateRedis {
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl PrivateRedis {
    /// A server, not started yet.
    pub fn new() -> PrivateRedis {
        let dir = std::env::temp_dir().join(format!("glia-redis-{}", Uuid::now_v7().simple()));
        std::fs::create_dir_all(&dir).expect("create the server's directory");
        PrivateRedis {
            port: free_port(),
            dir,
            child: None,
        }
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Start `redis-server` (or start it again, on the same port) without
    /// waiting for it; see [`PrivateRedis::wait_ready`]. Errors when it
    /// cannot be run (not installed: a test then skips, loudly). Does
    /// nothing when it is already running.
    pub fn start(&mut self) -> std::io::Result<()> {
        if running(&mut self.child) {
            return Ok(());
        }
        let child = Command::new("redis-server")
            .args([
                "--port",
                &self.port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "no",
            ])
            .arg("--dir")
            .arg(&self.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        self.child = Some(child);
        Ok(())
    }

    /// Poll until the server answers `PING`.
    ///
    /// # Panics
    ///
    /// When it does not within `timeout`.
    pub async fn wait_ready(&self, timeout: Duration) {
        let client = redis::Client::open(self.url()).expect("a valid redis URL");
        let deadline = Instant::now() + timeout;
        loop {
            let connected = tokio::time::timeout(
                Duration::from_secs(2),
                client.get_multiplexed_async_connection(),
            )
            .await;
            if let Ok(Ok(mut conn)) = connected
                && redis::cmd("PING")
                    .query_async::<String>(&mut conn)
                    .await
                    .is_ok()
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "private redis-server on port {} not ready within {timeout:?}",
                self.port
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// SIGTERM and wait (up to 10 s, then SIGKILL).
    pub async fn stop(&mut self) {
        if !terminate(&mut self.child, Duration::from_secs(10)).await {
            self.kill();
        }
    }

    /// SIGKILL the server and reap it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Default for PrivateRedis {
    fn default() -> Self {
        PrivateRedis::new()
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The admin Postgres URL tests connect with: `GLIA_DATABASE_URL`, default
/// `postgres://postgres@127.0.0.1:5432/postgres`.
pub fn postgres_admin_config() -> tokio_postgres::Config {
    let url = std::env::var("GLIA_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    url.parse().expect("GLIA_DATABASE_URL is a postgres:// URL")
}

/// A plain connection to `config`, its connection task spawned.
pub async fn postgres_connect(config: &tokio_postgres::Config) -> tokio_postgres::Client {
    let (client, connection) = config
        .connect(tokio_postgres::NoTls)
        .await
        .expect("connect to postgres");
    tokio::spawn(connection);
    client
}

/// A Postgres database of its own (`glia_test_<uuid>`), dropped with its
/// connections when this is, even after a panic.
pub struct TestDb {
    /// Database name.
    pub name: String,
    admin: tokio_postgres::Config,
}

impl TestDb {
    /// Create the database, on the server of `GLIA_DATABASE_URL`.
    pub async fn new() -> TestDb {
        TestDb::on(postgres_admin_config()).await
    }

    /// Create the database on the server `admin` connects to (its database
    /// is only used to create and drop this one).
    pub async fn on(admin: tokio_postgres::Config) -> TestDb {
        let name = format!("glia_test_{}", Uuid::now_v7().simple());
        postgres_connect(&admin)
            .await
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .expect("create a test database");
        TestDb { name, admin }
    }

    /// Connection settings for this database.
    pub fn config(&self) -> tokio_postgres::Config {
        let mut config = self.admin.clone();
        config.dbname(&self.name);
        config
    }

    /// A [`crate::postgres::PgLog`] on this database, default options.
    pub async fn log(&self) -> crate::postgres::PgLog {
        self.log_with(crate::postgres::PgOptions::default()).await
    }

    /// A [`crate::postgres::PgLog`] on this database with `options`.
    pub async fn log_with(&self, options: crate::postgres::PgOptions) -> crate::postgres::PgLog {
        crate::postgres::PgLog::connect_with(self.config(), options)
            .await
            .expect("PgLog::connect")
    }

    /// A plain connection, for looking under the adapter.
    pub async fn sql(&self) -> tokio_postgres::Client {
        postgres_connect(&self.config()).await
    }

    /// The single `bigint` a query returns.
    pub async fn count(&self, query: &str) -> i64 {
        self.sql()
            .await
            .query_one(query, &[])
            .await
            .expect(query)
            .get(0)
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let (name, admin) = (self.name.clone(), self.admin.clone());
        // Drop runs inside the test's runtime: use a thread with its own.
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            runtime.block_on(async move {
                let (client, connection) = admin.connect(tokio_postgres::NoTls).await.ok()?;
                tokio::spawn(connection);
                client
                    .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                    .await
                    .ok()
            })
        })
        .join();
        if !matches!(dropped, Ok(Some(()))) {
            eprintln!("could not drop test database {}", self.name);
        }
    }
}

/// Deletes every Redis key under `prefix:` at `url` when dropped, even when
/// the test panicked (on a thread of its own with its own runtime).
pub struct RedisKeys {
    /// Redis URL.
    pub url: String,
    /// Key prefix (without the `:`).
    pub prefix: String,
}

impl Drop for RedisKeys {
    fn drop(&mut self) {
        let (url, prefix) = (self.url.clone(), self.prefix.clone());
        let done = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async {
                let Ok(client) = redis::Client::open(url.as_str()) else {
                    return;
                };
                let Ok(mut conn) = client.get_multiplexed_async_connection().await else {
                    return;
                };
                let keys: Vec<String> = redis::cmd("KEYS")
                    .arg(format!("{prefix}:*"))
                    .query_async(&mut conn)
                    .await
                    .unwrap_or_default();
                if !keys.is_empty() {
                    let _: Result<(), _> =
                        redis::cmd("DEL").arg(&keys).query_async(&mut conn).await;
                }
            })
        });
        let _ = done.join();
    }
}

/// A temporary directory of a test's own (`glia-sqlite-<uuid>` in the
/// temporary directory) for a single node's SQLite file, removed with
/// everything in it when dropped, even after a panic.
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    /// Create it.
    pub fn new() -> TempDir {
        let path = std::env::temp_dir().join(format!("glia-sqlite-{}", Uuid::now_v7().simple()));
        std::fs::create_dir_all(&path).expect("create a temporary directory");
        TempDir { path }
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `DIR/node.db`: where a test's single node keeps its file.
    pub fn db(&self) -> PathBuf {
        self.path.join("node.db")
    }
}

impl Default for TempDir {
    fn default() -> Self {
        TempDir::new()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}
