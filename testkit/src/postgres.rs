//! A private PostgreSQL cluster for tests that stop, crash or restart the
//! database: its own data directory (`initdb`), port and socket directory,
//! run with the installed server binaries (`/usr/lib/postgresql/<N>/bin`,
//! the newest found, or `GLIA_PG_BIN`). The machine's cluster is never
//! touched. When the tests run as root, the cluster runs as the `postgres`
//! user (`runuser`), as PostgreSQL refuses root.
//!
//! Authentication is `trust` for user `postgres` on 127.0.0.1. Dropping it
//! stops the cluster immediately and removes the directory.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use uuid::Uuid;

/// A private cluster (see the module docs).
pub struct PrivatePostgres {
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
    as_postgres: bool,
}

/// How to stop the cluster (`pg_ctl stop -m MODE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopMode {
    /// `-m fast`: roll back open transactions, disconnect clients, checkpoint.
    Fast,
    /// `-m immediate`: quit without a checkpoint, like a crash; the next
    /// start replays the WAL.
    Immediate,
}

impl PrivatePostgres {
    /// The server binaries' directory, if PostgreSQL is installed.
    pub fn bin_dir() -> Option<PathBuf> {
        if let Ok(dir) = std::env::var("GLIA_PG_BIN") {
            return Some(PathBuf::from(dir));
        }
        let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
            .ok()?
            .filter_map(|e| Some(e.ok()?.path().join("bin")))
            .filter(|p| p.join("initdb").exists())
            .collect();
        found.sort_by_key(|p| {
            p.parent()
                .and_then(|v| v.file_name()?.to_str()?.parse::<u32>().ok())
                .unwrap_or(0)
        });
        found.pop()
    }

    /// Create (`initdb`) and start a cluster, waiting until it accepts
    /// connections. `None` when PostgreSQL's server binaries are not
    /// installed (a test then skips, loudly). Panics when `initdb` or the
    /// start fails, with the server's log.
    pub fn start_new() -> Option<PrivatePostgres> {
        let bin = PrivatePostgres::bin_dir()?;
        let dir = std::env::temp_dir().join(format!("glia-pg-{}", Uuid::now_v7().simple()));
        std::fs::create_dir_all(&dir).expect("create the cluster's directory");
        let as_postgres = Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
        if as_postgres {
            let ok = Command::new("chown")
                .args(["postgres:postgres"])
                .arg(&dir)
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "chown postgres {}", dir.display());
        }
        let pg = PrivatePostgres {
            bin,
            dir,
            port: crate::isolation::free_port(),
            as_postgres,
        };
        let out = pg
            .tool("initdb")
            .args(["-D"])
            .arg(pg.data())
            .args(["-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8"])
            .output()
            .expect("initdb runs");
        assert!(
            out.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let conf = format!(
            "port = {}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{}'\nmax_connections = 60\nfsync = on\nshared_buffers = 32MB\n",
            pg.port,
            pg.dir.display()
        );
        let path = pg.data().join("postgresql.auto.conf");
        std::fs::write(&path, conf).expect("write the cluster's config");
        if as_postgres {
            let _ = Command::new("chown")
                .args(["postgres:postgres"])
                .arg(&path)
                .status();
        }
        pg.start();
        Some(pg)
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn tool(&self, name: &str) -> Command {
        let exe = self.bin.join(name);
        let mut cmd = if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(exe);
            c
        } else {
            Command::new(exe)
        };
        cmd.stdin(Stdio::null());
        cmd
    }

    /// `postgres://postgres@127.0.0.1:<port>/postgres`, the admin database.
    pub fn admin_url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The cluster's directory (`data/`, `server.log`, the socket).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The last lines of the server log, for failure messages.
    pub fn log_tail(&self) -> String {
        crate::isolation::tail(&self.dir.join("server.log"), 40)
    }

    /// Start the cluster (`pg_ctl start -w`) and wait until it accepts
    /// connections (crash recovery included). Panics with the log on failure.
    pub fn start(&self) {
        let out = self
            .tool("pg_ctl")
            .args(["start", "-w", "-t", "120", "-D"])
            .arg(self.data())
            .arg("-l")
            .arg(self.dir.join("server.log"))
            .output()
            .expect("pg_ctl runs");
        assert!(
            out.status.success(),
            "pg_ctl start: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.log_tail()
        );
        let deadline = Instant::now() + Duration::from_secs(120);
        while !self.accepts() {
            assert!(
                Instant::now() < deadline,
                "private postgres not ready:\n{}",
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Whether a `SELECT 1` as `postgres` succeeds now.
    pub fn accepts(&self) -> bool {
        Command::new("psql")
            .args([&self.admin_url(), "-qAtc", "SELECT 1"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// Stop the cluster (`pg_ctl stop -w -m MODE`).
    pub fn stop(&self, mode: StopMode) {
        let m = match mode {
            StopMode::Fast => "fast",
            StopMode::Immediate => "immediate",
        };
        let out = self
            .tool("pg_ctl")
            .args(["stop", "-w", "-t", "120", "-m", m, "-D"])
            .arg(self.data())
            .output()
            .expect("pg_ctl runs");
        assert!(
            out.status.success(),
            "pg_ctl stop -m {m}: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.log_tail()
        );
    }

    /// Stop with `mode`, then start again on the same data and port.
    pub fn restart(&self, mode: StopMode) {
        self.stop(mode);
        self.start();
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        let _ = self
            .tool("pg_ctl")
            .args(["stop", "-w", "-m", "immediate", "-D"])
            .arg(self.data())
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
