//! A network partition for one process, in userspace: a TCP proxy between
//! it and a service ([`Proxy`]), and one proxy per service of a process
//! ([`Partition`]). While a partition is on, the proxies forward nothing
//! (they stop reading both sides, and new connections are accepted but not
//! connected upstream), so the process stays alive, its connections stay
//! open, and whatever it sends waits in the socket buffers, as behind a
//! switch that drops every packet; when the partition heals, forwarding
//! resumes on the same connections (late writes arrive late). [`Proxy::cut`]
//! instead closes every connection, as a reset would.
//!
//! Each proxy runs on a thread and Tokio runtime of its own, so blocking
//! tests can use it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// What the proxy does with traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Mode {
    /// Forwarding stopped (partitioned).
    frozen: bool,
    /// Bumped by [`Proxy::cut`]: connections of an older generation close.
    generation: u64,
}

/// A TCP proxy from a local port to `upstream`, with a switch.
pub struct Proxy {
    /// Where clients connect (`127.0.0.1:PORT`).
    pub listen: SocketAddr,
    /// Where it forwards to.
    pub upstream: SocketAddr,
    mode: watch::Sender<Mode>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Proxy {
    /// Listen on a free loopback port and forward each connection to
    /// `upstream` (connected when the client connects; a client whose
    /// upstream does not answer is closed).
    pub fn start(upstream: SocketAddr) -> Proxy {
        let (mode, _) = watch::channel(Mode {
            frozen: false,
            generation: 0,
        });
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (shutdown, stop) = tokio::sync::oneshot::channel::<()>();
        let modes = mode.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("proxy runtime");
            rt.block_on(async move {
                let listener = TcpListener::bind("127.0.0.1:0").await.expect("proxy binds");
                ready_tx
                    .send(listener.local_addr().expect("proxy address"))
                    .expect("proxy reports its address");
                let accept = async {
                    loop {
                        let Ok((client, _)) = listener.accept().await else {
                            continue;
                        };
                        tokio::spawn(connection(client, upstream, modes.subscribe()));
                    }
                };
                tokio::select! {
                    () = accept => {}
                    _ = stop => {}
                }
            });
        });
        let listen = ready_rx.recv().expect("proxy starts");
        Proxy {
            listen,
            upstream,
            mode,
            shutdown: Some(shutdown),
            thread: Some(thread),
        }
    }

    /// Stop forwarding (both directions, every connection, new ones too).
    pub fn freeze(&self) {
        self.mode.send_modify(|m| m.frozen = true);
    }

    /// Forward again, on the same connections.
    pub fn thaw(&self) {
        self.mode.send_modify(|m| m.frozen = false);
    }

    /// Close every open connection (new ones are forwarded as usual).
    pub fn cut(&self) {
        self.mode.send_modify(|m| m.generation += 1);
    }

    /// `url` with its host and port replaced by the proxy's, e.g.
    /// `postgres://u@127.0.0.1:5432/db` → `postgres://u@127.0.0.1:PORT/db`.
    pub fn route(&self, url: &str) -> String {
        let mut u = reqwest::Url::parse(url).unwrap_or_else(|e| panic!("{url}: {e}"));
        u.set_host(Some(&self.listen.ip().to_string()))
            .expect("a URL with a host");
        u.set_port(Some(self.listen.port()))
            .expect("a URL with a port");
        u.to_string()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.cut();
        if let Some(s) = self.shutdown.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Wait while the proxy is frozen; `false` when the connection's generation
/// was cut (or the proxy is gone).
async fn open(mode: &mut watch::Receiver<Mode>, generation: u64) -> bool {
    mode.wait_for(|m| !m.frozen || m.generation != generation)
        .await
        .is_ok_and(|m| m.generation == generation)
}

/// One client connection: connect upstream (once not frozen), then copy
/// both ways until either side closes or the connection is cut.
async fn connection(client: TcpStream, upstream: SocketAddr, mut mode: watch::Receiver<Mode>) {
    let generation = mode.borrow().generation;
    if !open(&mut mode, generation).await {
        return;
    }
    let Ok(Ok(server)) =
        tokio::time::timeout(Duration::from_secs(10), TcpStream::connect(upstream)).await
    else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (cr, cw) = client.into_split();
    let (sr, sw) = server.into_split();
    let up = pump(cr, sw, mode.clone(), generation);
    let down = pump(sr, cw, mode.clone(), generation);
    let cut = async {
        let _ = mode.wait_for(|m| m.generation != generation).await;
    };
    // Either direction ending (or a cut) closes both.
    tokio::select! {
        () = up => {}
        () = down => {}
        () = cut => {}
    }
}

/// Copy `from` to `to`, holding what was read while frozen until thawed.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut mode: watch::Receiver<Mode>,
    generation: u64,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        if !open(&mut mode, generation).await {
            return;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        // A read that was pending when the partition began is not delivered
        // until it heals.
        if !open(&mut mode, generation).await || to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// One process's partition: a [`Proxy`] per service it talks to. Route the
/// process's service URLs through the proxies [`Partition::new`] returns, then
/// [`Partition::start`] / [`Partition::heal`] it.
pub struct Partition {
    proxies: Vec<Arc<Proxy>>,
}

impl Partition {
    /// A proxy for each of `urls` (e.g. the database, broker and Redis
    /// URLs); returns the partition and the URLs to give the process, in
    /// the same order.
    pub fn new(urls: &[&str]) -> (Partition, Vec<String>) {
        let mut proxies = Vec::new();
        let mut routed = Vec::new();
        for url in urls {
            let proxy = Proxy::start(upstream_of(url));
            routed.push(proxy.route(url));
            proxies.push(Arc::new(proxy));
        }
        (Partition { proxies }, routed)
    }

    /// Cut the process off: nothing it sends arrives, nothing arrives to it.
    pub fn start(&self) {
        self.proxies.iter().for_each(|p| p.freeze());
    }

    /// Let traffic through again, on the connections it had.
    pub fn heal(&self) {
        self.proxies.iter().for_each(|p| p.thaw());
    }
}

/// The `host:port` a service URL names (default ports of `postgres`,
/// `amqp` and `redis` when left out), resolved.
pub fn upstream_of(url: &str) -> SocketAddr {
    use std::net::ToSocketAddrs;
    let u = reqwest::Url::parse(url).unwrap_or_else(|e| panic!("{url}: {e}"));
    let port = u.port().unwrap_or(match u.scheme() {
        "postgres" | "postgresql" => 5432,
        "amqp" => 5672,
        "redis" => 6379,
        other => panic!("{url}: no default port for {other}"),
    });
    let host = u.host_str().unwrap_or("127.0.0.1");
    (host, port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .unwrap_or_else(|| panic!("{url}: does not resolve"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    /// An echo server on a free port.
    fn echo() -> SocketAddr {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut s) = stream else { continue };
                std::thread::spawn(move || {
                    let mut buf = [0u8; 1024];
                    while let Ok(n) = s.read(&mut buf) {
                        if n == 0 || s.write_all(&buf[..n]).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    #[test]
    fn forwards_holds_while_frozen_resumes_and_cuts() {
        let proxy = Proxy::start(echo());
        let mut c = std::net::TcpStream::connect(proxy.listen).unwrap();
        c.set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        let mut buf = [0u8; 5];
        c.write_all(b"hello").unwrap();
        c.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"hello");
        // Frozen: what is sent does not come back, on the same connection.
        proxy.freeze();
        c.write_all(b"late!").unwrap();
        assert!(c.read(&mut buf).is_err(), "nothing passes a frozen proxy");
        // Healed: the late write arrives.
        proxy.thaw();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        c.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"late!");
        // Cut: the connection closes.
        proxy.cut();
        assert_eq!(
            c.read(&mut buf).unwrap_or(0),
            0,
            "a cut connection is closed"
        );
        assert_eq!(
            proxy.route("postgres://postgres@127.0.0.1:5432/db"),
            format!("postgres://postgres@127.0.0.1:{}/db", proxy.listen.port())
        );
    }
}
