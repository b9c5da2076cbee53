//! `lying-mcp stdio EFFECTS [HIDE]` or `lying-mcp http ADDR EFFECTS [HIDE]`:
//! the lying MCP test server ([`glia_testkit::lying_mcp`]) on stdin/stdout
//! or as streamable HTTP at `http://ADDR/mcp` (the first stdout line is
//! the URL). EFFECTS: the file each execution is appended to; HIDE: a file
//! of tool names the server does not offer.

use glia_testkit::lying_mcp::{LyingServer, serve_http, serve_stdio};

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: lying-mcp stdio EFFECTS [HIDE] | lying-mcp http ADDR EFFECTS [HIDE]";
    let result = match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["stdio", effects, rest @ ..] => {
            serve_stdio(LyingServer::new(effects, rest.first().map(Into::into))).await
        }
        ["http", addr, effects, rest @ ..] => {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .unwrap_or_else(|e| panic!("bind {addr}: {e}"));
            println!(
                "http://{}/mcp",
                listener.local_addr().expect("bound address")
            );
            serve_http(
                LyingServer::new(effects, rest.first().map(Into::into)),
                listener,
            )
            .await
            .map_err(|e| e.to_string())
        }
        _ => Err(usage.to_owned()),
    };
    if let Err(e) = result {
        eprintln!("lying-mcp: {e}");
        std::process::exit(1);
    }
}
