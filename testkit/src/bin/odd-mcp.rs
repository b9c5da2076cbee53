//! `odd-mcp stdio STATE [--list MODE] [--banner]` or `odd-mcp http ADDR
//! STATE [--list MODE]`: the misbehaving MCP test server
//! ([`glia_testkit::odd_mcp`]) on stdin/stdout or as streamable HTTP at
//! `http://ADDR/mcp` (the first stdout line is the URL). STATE: the
//! directory of its request log and tools file.

use glia_testkit::odd_mcp::{ListMode, OddServer, serve_http, serve_stdio};

#[tokio::main]
async fn main() {
    let usage = "usage: odd-mcp stdio STATE [--list normal|paged|looping-cursor|never] [--banner] | odd-mcp http ADDR STATE [--list MODE]";
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut list = ListMode::Normal;
    let mut banner = false;
    let mut positional = Vec::new();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--banner" => banner = true,
            "--list" => {
                list = it
                    .next()
                    .and_then(|m| ListMode::parse(m))
                    .unwrap_or_else(|| fail(usage));
            }
            other => positional.push(other),
        }
    }
    let result = match positional.as_slice() {
        ["stdio", state] => serve_stdio(OddServer::new(state, list), banner).await,
        ["http", addr, state] => {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .unwrap_or_else(|e| fail(&format!("bind {addr}: {e}")));
            println!(
                "http://{}/mcp",
                listener.local_addr().expect("bound address")
            );
            serve_http(OddServer::new(state, list), listener)
                .await
                .map_err(|e| e.to_string())
        }
        _ => Err(usage.to_owned()),
    };
    if let Err(e) = result {
        fail(&e);
    }
}

fn fail(message: &str) -> ! {
    eprintln!("odd-mcp: {message}");
    std::process::exit(1);
}
