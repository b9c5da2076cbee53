//! A local HTTP/1.1 server on 127.0.0.1 that replays recorded provider
//! answers (the fixtures of `providers/tests/fixtures`) in order, one
//! request per connection, and records what it received.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

use serde_json::Value;

/// The bytes of `providers/tests/fixtures/{path}`.
pub fn fixture(path: &str) -> Vec<u8> {
    let p = format!("{}/../providers/tests/fixtures/{path}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&p).unwrap_or_else(|e| panic!("fixture {p}: {e}"))
}

/// One answer.
#[derive(Debug, Clone)]
pub struct Reply {
    /// Status line after `HTTP/1.1 `, e.g. `200 OK`.
    pub status: String,
    /// Headers besides content-length and connection.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
}

impl Reply {
    /// A 200 event stream from a fixture file.
    pub fn sse(path: &str) -> Reply {
        Reply { status: "200 OK".into(), headers: vec![("content-type".into(), "text/event-stream".into())], body: fixture(path) }
    }

    /// A JSON error body from a fixture file with `status`.
    pub fn error(status: &str, path: &str) -> Reply {
        Reply { status: status.into(), headers: vec![("content-type".into(), "application/json".into())], body: fixture(path) }
    }

    /// Add a header.
    pub fn header(mut self, name: &str, value: &str) -> Reply {
        self.headers.push((name.into(), value.into()));
        self
    }
}

/// One request the server received.
#[derive(Debug, Clone)]
pub struct Seen {
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Value,
}

impl Seen {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }
}

/// The server; it lives as long as the test process.
pub struct Local {
    pub base: String,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Local {
    /// Answer the n-th request with `replies[n]`; after the last, HTTP 500.
    pub fn serve(replies: Vec<Reply>) -> Local {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        std::thread::spawn(move || {
            let mut n = 0;
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { continue };
                let Some(request) = read_request(&conn) else { continue };
                log.lock().unwrap().push(request);
                let reply = replies.get(n).cloned().unwrap_or_else(|| Reply {
                    status: "500 Internal Server Error".into(),
                    headers: vec![("content-type".into(), "application/json".into())],
                    body: br#"{"error":{"message":"no more replies","type":"server_error"}}"#.to_vec(),
                });
                n += 1;
                let mut head = format!("HTTP/1.1 {}\r\n", reply.status);
                for (k, v) in &reply.headers {
                    head.push_str(&format!("{k}: {v}\r\n"));
                }
                head.push_str(&format!("content-length: {}\r\nconnection: close\r\n\r\n", reply.body.len()));
                let _ = conn.write_all(head.as_bytes()).and_then(|()| conn.write_all(&reply.body));
            }
        });
        Local { base, seen }
    }

    /// Answer with these event-stream fixtures, in order.
    pub fn streams(paths: &[&str]) -> Local {
        Local::serve(paths.iter().map(|p| Reply::sse(p)).collect())
    }

    /// The requests so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

fn read_request(conn: &TcpStream) -> Option<Seen> {
    let mut reader = BufReader::new(conn.try_clone().ok()?);
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let path = line.split_whitespace().nth(1)?.to_owned();
    let mut headers = Vec::new();
    loop {
        line.clear();
        reader.read_line(&mut line).ok()?;
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        let (k, v) = l.split_once(':')?;
        headers.push((k.trim().to_ascii_lowercase(), v.trim().to_owned()));
    }
    let len: usize = headers.iter().find(|(k, _)| k == "content-length").and_then(|(_, v)| v.parse().ok()).unwrap_or(0);
    let mut body = vec![0; len];
    reader.read_exact(&mut body).ok()?;
    Some(Seen { path, headers, body: serde_json::from_slice(&body).unwrap_or(Value::Null) })
}
