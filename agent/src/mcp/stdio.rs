//! A stdio MCP server's process, owned by glia rather than by rmcp, so that
//! its death can be named and its stdout kept clean:
//!
//! - **Exit.** A keeper task owns the child (`kill_on_drop`). When the
//!   child exits on its own its [`ExitStatus`] is kept; when the connection
//!   is closed (shutdown, or rmcp gave up on it) the keeper runs the MCP
//!   stdio shutdown sequence: stdin is closed, then after
//!   [`STOP_GRACE`] `SIGTERM`, then after [`STOP_GRACE`] again `SIGKILL`.
//! - **Stderr.** Each line is logged at debug level (target
//!   `glia_agent::mcp::stderr`) with every secret value replaced by
//!   `[redacted]`, and the last [`TAIL_LINES`] lines (at most
//!   [`TAIL_BYTES`] bytes) are kept for [`Process::death`].
//! - **Stdout.** A filter sits between the child's stdout and rmcp: a line
//!   whose first non-blank byte is `{` (a JSON-RPC message) passes through
//!   byte for byte and unbuffered; any other line (a banner, a log line) is
//!   not handed to rmcp and is logged at `warn` — its first
//!   [`NOISE_HEAD_BYTES`] bytes, secrets redacted — at most once per server
//!   per [`NOISE_LOG_EVERY`], with the count of lines left out since the
//!   last one logged.

use std::collections::VecDeque;
use std::process::ExitStatus;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::RoleClient;
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use rmcp::transport::async_rw::AsyncRwTransport;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::process::{Child, ChildStderr, ChildStdin, ChildStdout};
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;
use tracing::{debug, warn};

/// How many of a server's last stderr lines [`Process::death`] reports.
pub const TAIL_LINES: usize = 20;
/// The most bytes of stderr [`Process::death`] reports (the last lines that fit).
pub const TAIL_BYTES: usize = 4096;
/// How many bytes of a non-JSON stdout line are logged.
pub const NOISE_HEAD_BYTES: usize = 80;
/// At most one non-JSON stdout line is logged per server in this time.
pub const NOISE_LOG_EVERY: Duration = Duration::from_secs(10);
/// How long each step of the shutdown sequence waits for the child to exit.
pub const STOP_GRACE: Duration = Duration::from_secs(3);
/// Bytes of a noise line kept before redaction (so that a secret cut at
/// [`NOISE_HEAD_BYTES`] is still recognised and redacted whole).
const NOISE_KEEP_BYTES: usize = 1024;
/// Leading blanks kept while deciding whether a line is JSON.
const MAX_LEADING_BLANKS: usize = 1024;

/// What glia knows of one stdio server process (one connection).
pub struct Process {
    exit: watch::Receiver<Option<std::io::Result<ExitStatus>>>,
    stderr: Arc<Mutex<StderrTail>>,
    stderr_closed: watch::Receiver<bool>,
}

impl Process {
    /// Why the process's connection ended, for the log and the model: how
    /// it exited (`exited with code 1`, `was killed by signal 9 (SIGKILL)`)
    /// and the last lines of its stderr (redacted). Waits up to `wait` for
    /// the exit and for stderr to close; past it says the process had not
    /// exited.
    pub async fn death(&self, wait: Duration) -> String {
        let deadline = Instant::now() + wait;
        let mut exit = self.exit.clone();
        let mut closed = self.stderr_closed.clone();
        let status = tokio::time::timeout_at(deadline, exit.wait_for(Option::is_some))
            .await
            .ok()
            .and_then(Result::ok)
            .map(|s| match s.as_ref().expect("waited for it") {
                Ok(status) => describe_exit(*status),
                Err(e) => format!("could not be waited for ({e})"),
            });
        // The last lines may still be in the pipe when the exit is seen.
        let _ = tokio::time::timeout_at(deadline, closed.wait_for(|c| *c)).await;
        let status = status.unwrap_or_else(|| {
            format!(
                "closed its connection but had not exited within {} ms",
                wait.as_millis()
            )
        });
        let tail = self.stderr.lock().expect("stderr tail").text();
        if tail.is_empty() {
            format!("the process {status}; it wrote nothing to stderr")
        } else {
            format!("the process {status}; the last lines of its stderr:\n{tail}")
        }
    }
}

/// `exited with code 3`, `was killed by signal 9 (SIGKILL)`.
pub fn describe_exit(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with code {code}"),
        (None, Some(signal)) => match nix::sys::signal::Signal::try_from(signal) {
            Ok(name) => format!("was killed by signal {signal} ({})", name.as_str()),
            Err(_) => format!("was killed by signal {signal}"),
        },
        (None, None) => format!("ended ({status})"),
    }
}

/// The last lines of a server's stderr: at most [`TAIL_LINES`] lines and
/// [`TAIL_BYTES`] bytes (a longer line is cut to its last bytes).
#[derive(Default)]
pub struct StderrTail {
    lines: VecDeque<String>,
    bytes: usize,
}

impl StderrTail {
    /// Keep `line` (already redacted), dropping the oldest lines past the bounds.
    pub fn push(&mut self, line: String) {
        let line = if line.len() > TAIL_BYTES {
            let mut start = line.len() - TAIL_BYTES;
            while !line.is_char_boundary(start) {
                start += 1;
            }
            line[start..].to_owned()
        } else {
            line
        };
        self.bytes += line.len();
        self.lines.push_back(line);
        while self.lines.len() > TAIL_LINES || self.bytes > TAIL_BYTES {
            let old = self.lines.pop_front().expect("not empty");
            self.bytes -= old.len();
        }
    }

    /// The lines kept, oldest first, joined by newlines.
    pub fn text(&self) -> String {
        self.lines
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// `text` with every non-empty secret value replaced by `[redacted]`.
fn redact(text: String, secrets: &[String]) -> String {
    secrets
        .iter()
        .filter(|s| !s.is_empty())
        .fold(text, |text, s| text.replace(s.as_str(), "[redacted]"))
}

/// The rmcp transport of a stdio server: JSON-RPC lines from the stdout
/// filter, requests to the child's stdin. Closing it closes stdin and
/// stops the process ([`STOP_GRACE`], `SIGTERM`, kill), waiting for its exit.
pub struct StdioTransport {
    inner: AsyncRwTransport<RoleClient, DuplexStream, ChildStdin>,
    stop: Option<oneshot::Sender<()>>,
    exit: watch::Receiver<Option<std::io::Result<ExitStatus>>>,
}

impl Transport<RoleClient> for StdioTransport {
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.inner.send(item)
    }

    fn receive(&mut self) -> impl Future<Output = Option<RxJsonRpcMessage<RoleClient>>> + Send {
        self.inner.receive()
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.inner.close().await?;
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = self.exit.wait_for(Option::is_some).await;
        Ok(())
    }
}

/// Spawn `cmd` (stdin, stdout and stderr piped here) as server `server`,
/// redacting `secrets` from what it writes, logging stdout noise through
/// `noise`. Returns the transport for rmcp, the process's record and its pid.
/// Errors: why it could not be started.
pub fn spawn(
    server: &str,
    mut cmd: tokio::process::Command,
    secrets: Vec<String>,
    noise: Arc<Mutex<NoiseLog>>,
) -> std::io::Result<(StdioTransport, Arc<Process>, Option<u32>)> {
    cmd.stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn()?;
    let pid = child.id();
    let (stdin, stdout, stderr) =
        match (child.stdin.take(), child.stdout.take(), child.stderr.take()) {
            (Some(i), Some(o), Some(e)) => (i, o, e),
            _ => return Err(std::io::Error::other("the child's pipes were not set up")),
        };
    let secrets: Arc<[String]> = secrets.into();
    let (exit_tx, exit) = watch::channel(None);
    let (stop, stopped) = oneshot::channel();
    tokio::spawn(keep(child, stopped, exit_tx));
    let tail = Arc::new(Mutex::new(StderrTail::default()));
    let (closed_tx, stderr_closed) = watch::channel(false);
    tokio::spawn(forward_stderr(
        server.to_owned(),
        stderr,
        secrets.clone(),
        tail.clone(),
        closed_tx,
    ));
    let (rmcp_side, filter_side) = tokio::io::duplex(64 * 1024);
    tokio::spawn(filter_stdout(
        server.to_owned(),
        stdout,
        filter_side,
        secrets,
        noise,
    ));
    let transport = StdioTransport {
        inner: AsyncRwTransport::new(rmcp_side, stdin),
        stop: Some(stop),
        exit: exit.clone(),
    };
    let process = Arc::new(Process {
        exit,
        stderr: tail,
        stderr_closed,
    });
    Ok((transport, process, pid))
}

/// Own `child` until it exits, or until `stop` (sent or dropped) asks for
/// the shutdown sequence; publish its exit status.
async fn keep(
    mut child: Child,
    stop: oneshot::Receiver<()>,
    exit: watch::Sender<Option<std::io::Result<ExitStatus>>>,
) {
    let status = tokio::select! {
        status = child.wait() => status,
        _ = stop => stop_child(&mut child).await,
    };
    exit.send_replace(Some(status));
}

/// The MCP stdio shutdown sequence, stdin already closed: wait, `SIGTERM`,
/// wait, kill.
async fn stop_child(child: &mut Child) -> std::io::Result<ExitStatus> {
    if let Ok(status) = tokio::time::timeout(STOP_GRACE, child.wait()).await {
        return status;
    }
    if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGTERM,
        );
        if let Ok(status) = tokio::time::timeout(STOP_GRACE, child.wait()).await {
            return status;
        }
    }
    child.kill().await?;
    child.wait().await
}

/// Longest stderr line kept, in bytes: the rest of a longer line is left
/// out (a server writing without newlines holds no more than this).
const MAX_STDERR_LINE: usize = 4096;

/// Log a stdio server's stderr at debug level and keep its tail, secret
/// values redacted, each line cut at [`MAX_STDERR_LINE`]; mark it closed at
/// its end.
async fn forward_stderr(
    server: String,
    stderr: ChildStderr,
    secrets: Arc<[String]>,
    tail: Arc<Mutex<StderrTail>>,
    closed: watch::Sender<bool>,
) {
    let mut reader = tokio::io::BufReader::new(stderr);
    let mut line = Vec::new();
    let mut cut = false;
    loop {
        let chunk = match reader.fill_buf().await {
            Ok([]) | Err(_) => break,
            Ok(chunk) => chunk,
        };
        let (part, ended) = match chunk.iter().position(|b| *b == b'\n') {
            Some(i) => (&chunk[..i], true),
            None => (chunk, false),
        };
        let room = MAX_STDERR_LINE.saturating_sub(line.len());
        line.extend_from_slice(&part[..part.len().min(room)]);
        cut |= part.len() > room;
        let used = part.len() + usize::from(ended);
        reader.consume(used);
        if ended {
            let mut text =
                String::from_utf8_lossy(line.strip_suffix(b"\r").unwrap_or(&line)).into_owned();
            if cut {
                text.push_str(" [line cut]");
            }
            let text = redact(text, &secrets);
            debug!(target: "glia_agent::mcp::stderr", server = %server, "{text}");
            tail.lock().expect("stderr tail").push(text);
            line.clear();
            cut = false;
        }
    }
    closed.send_replace(true);
}

/// Copy a stdio server's stdout to rmcp through a [`LineFilter`], logging
/// what it leaves out through `noise`. At the end of stdout (or when rmcp
/// stops reading) rmcp's side sees the end of its input.
async fn filter_stdout(
    server: String,
    mut stdout: ChildStdout,
    mut to_rmcp: DuplexStream,
    secrets: Arc<[String]>,
    noise: Arc<Mutex<NoiseLog>>,
) {
    let mut filter = LineFilter::default();
    let mut buf = vec![0u8; 64 * 1024];
    let mut out = Vec::with_capacity(buf.len());
    let log = |line: NoiseLine| {
        let admitted = noise
            .lock()
            .expect("noise log")
            .admit(std::time::Instant::now());
        if let Some(suppressed) = admitted {
            let head = noise_head(&line.head, &secrets);
            warn!(
                server = %server,
                bytes = line.len,
                suppressed,
                "MCP server {server} wrote a line to stdout that is not JSON-RPC; left out (first {NOISE_HEAD_BYTES} bytes): {head}"
            );
        }
    };
    loop {
        let n = match stdout.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        filter.feed(&buf[..n], &mut out).into_iter().for_each(log);
        if to_rmcp.write_all(&out).await.is_err() {
            return;
        }
        out.clear();
    }
    filter.finish().into_iter().for_each(log);
    let _ = to_rmcp.shutdown().await;
}

/// The logged form of a noise line's head: secrets redacted, then cut to
/// [`NOISE_HEAD_BYTES`] bytes (at a character boundary), as lossy UTF-8.
pub fn noise_head(head: &[u8], secrets: &[String]) -> String {
    let text = String::from_utf8_lossy(head);
    let text = redact(text.trim_end_matches('\r').to_owned(), secrets);
    let mut end = text.len().min(NOISE_HEAD_BYTES);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

/// A stdout line that is not JSON-RPC: its first bytes and its length.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoiseLine {
    /// Its first bytes (up to 1 KiB), before redaction.
    pub head: Vec<u8>,
    /// Its length in bytes, without the newline.
    pub len: usize,
}

/// Splits a byte stream into lines that go to rmcp unchanged (first
/// non-blank byte `{`, and blank lines) and [`NoiseLine`]s, without holding
/// a whole line: JSON bytes are passed on as they come.
#[derive(Debug, Default)]
pub struct LineFilter {
    state: LineState,
}

#[derive(Debug)]
enum LineState {
    /// At the start of a line; the blanks seen so far.
    Start(Vec<u8>),
    /// Inside a line passed to rmcp.
    Json,
    /// Inside a line left out.
    Noise(NoiseLine),
}

impl Default for LineState {
    fn default() -> Self {
        LineState::Start(Vec::new())
    }
}

impl LineFilter {
    /// Feed `chunk`: the bytes for rmcp are appended to `out`; the noise
    /// lines it completed are returned.
    pub fn feed(&mut self, mut chunk: &[u8], out: &mut Vec<u8>) -> Vec<NoiseLine> {
        let mut noise = Vec::new();
        while let Some(&first) = chunk.first() {
            match &mut self.state {
                LineState::Start(blanks) => {
                    if first == b'{' {
                        out.append(blanks);
                        self.state = LineState::Json;
                    } else if first == b'\n' {
                        out.append(blanks);
                        out.push(b'\n');
                        chunk = &chunk[1..];
                    } else if first.is_ascii_whitespace() && blanks.len() < MAX_LEADING_BLANKS {
                        blanks.push(first);
                        chunk = &chunk[1..];
                    } else {
                        let len = blanks.len();
                        self.state = LineState::Noise(NoiseLine {
                            head: std::mem::take(blanks),
                            len,
                        });
                    }
                }
                LineState::Json => match chunk.iter().position(|&b| b == b'\n') {
                    Some(i) => {
                        out.extend_from_slice(&chunk[..=i]);
                        chunk = &chunk[i + 1..];
                        self.state = LineState::default();
                    }
                    None => {
                        out.extend_from_slice(chunk);
                        chunk = &[];
                    }
                },
                LineState::Noise(line) => {
                    let end = chunk.iter().position(|&b| b == b'\n');
                    let part = &chunk[..end.unwrap_or(chunk.len())];
                    let room = NOISE_KEEP_BYTES.saturating_sub(line.head.len());
                    line.head.extend_from_slice(&part[..part.len().min(room)]);
                    line.len += part.len();
                    match end {
                        Some(i) => {
                            chunk = &chunk[i + 1..];
                            if let LineState::Noise(line) = std::mem::take(&mut self.state) {
                                noise.push(line);
                            }
                        }
                        None => chunk = &[],
                    }
                }
            }
        }
        noise
    }

    /// The end of the stream: a noise line without its newline, if any.
    pub fn finish(&mut self) -> Option<NoiseLine> {
        match std::mem::take(&mut self.state) {
            LineState::Noise(line) => Some(line),
            _ => None,
        }
    }
}

/// The rate limit on one server's stdout noise log: one line per
/// [`NOISE_LOG_EVERY`], counting the lines left out in between.
#[derive(Debug, Default)]
pub struct NoiseLog {
    last: Option<std::time::Instant>,
    suppressed: u64,
}

impl NoiseLog {
    /// A noise line seen at `now`: `Some(lines left out since the last one
    /// logged)` when it is to be logged, `None` when it is left out.
    pub fn admit(&mut self, now: std::time::Instant) -> Option<u64> {
        match self.last {
            Some(last) if now.saturating_duration_since(last) < NOISE_LOG_EVERY => {
                self.suppressed += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.suppressed))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(chunks: &[&[u8]]) -> (Vec<u8>, Vec<NoiseLine>) {
        let mut filter = LineFilter::default();
        let mut out = Vec::new();
        let mut noise = Vec::new();
        for chunk in chunks {
            noise.extend(filter.feed(chunk, &mut out));
        }
        noise.extend(filter.finish());
        (out, noise)
    }

    #[test]
    fn json_lines_pass_byte_for_byte_and_noise_is_left_out() {
        let input: &[u8] = b"Server starting on stdio...\n{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\r\n  {\"a\": \"b\xc3\xa9\"}\n\n[INFO] ready\n{\"x\":1}\n";
        let expected: &[u8] =
            b"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\r\n  {\"a\": \"b\xc3\xa9\"}\n\n{\"x\":1}\n";
        // Whole, and cut at every byte: the same result.
        let (out, noise) = run(&[input]);
        assert_eq!(out, expected);
        assert_eq!(
            noise,
            vec![
                NoiseLine {
                    head: b"Server starting on stdio...".to_vec(),
                    len: 27
                },
                NoiseLine {
                    head: b"[INFO] ready".to_vec(),
                    len: 12
                },
            ]
        );
        for cut in 0..input.len() {
            let (a, b) = input.split_at(cut);
            assert_eq!(
                run(&[a, b]),
                (expected.to_vec(), noise.clone()),
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn a_long_noise_line_keeps_only_its_head_and_a_partial_one_is_reported_at_the_end() {
        let long = vec![b'x'; 10 * NOISE_KEEP_BYTES];
        let (out, noise) = run(&[&long, b"\n{}\n", b"tail without newline"]);
        assert_eq!(out, b"{}\n");
        assert_eq!(noise[0].len, long.len());
        assert_eq!(noise[0].head.len(), NOISE_KEEP_BYTES);
        assert_eq!(noise[1].head, b"tail without newline");
    }

    #[test]
    fn the_logged_head_is_80_bytes_at_most_with_secrets_redacted() {
        let secrets = vec!["hunter2-secret".to_owned()];
        let line = format!("{}hunter2-secret and more", "é".repeat(35));
        let head = noise_head(line.as_bytes(), &secrets);
        assert_eq!(head, format!("{}[redacted]", "é".repeat(35)));
        // Cut at a character boundary.
        let head = noise_head("é".repeat(60).as_bytes(), &secrets);
        assert_eq!(head, "é".repeat(40));
        // A secret cut by the 80-byte limit is still redacted, not shown in part.
        let line = format!("{}hunter2-secret", "a".repeat(75));
        assert_eq!(
            noise_head(line.as_bytes(), &secrets),
            format!("{}[reda", "a".repeat(75))
        );
    }

    #[test]
    fn noise_is_logged_once_per_interval_with_the_count_left_out() {
        let mut log = NoiseLog::default();
        let t0 = std::time::Instant::now();
        assert_eq!(log.admit(t0), Some(0));
        assert_eq!(log.admit(t0 + Duration::from_secs(1)), None);
        assert_eq!(log.admit(t0 + Duration::from_secs(9)), None);
        assert_eq!(log.admit(t0 + NOISE_LOG_EVERY), Some(2));
        assert_eq!(log.admit(t0 + NOISE_LOG_EVERY), None);
        assert_eq!(log.admit(t0 + 3 * NOISE_LOG_EVERY), Some(1));
    }

    #[test]
    fn the_stderr_tail_keeps_the_last_lines_within_its_bounds() {
        let mut tail = StderrTail::default();
        for i in 0..100 {
            tail.push(format!("line {i}"));
        }
        let text = tail.text();
        assert_eq!(text.lines().count(), TAIL_LINES);
        assert!(
            text.starts_with("line 80\n") && text.ends_with("line 99"),
            "{text}"
        );
        tail.push("y".repeat(3 * TAIL_BYTES));
        assert_eq!(tail.text(), "y".repeat(TAIL_BYTES));
        tail.push("last".into());
        assert_eq!(tail.text(), "last");
    }

    #[test]
    fn exits_are_named_by_code_or_signal() {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            describe_exit(ExitStatus::from_raw(3 << 8)),
            "exited with code 3"
        );
        assert_eq!(
            describe_exit(ExitStatus::from_raw(9)),
            "was killed by signal 9 (SIGKILL)"
        );
        assert_eq!(
            describe_exit(ExitStatus::from_raw(15)),
            "was killed by signal 15 (SIGTERM)"
        );
    }
}
