//! The recorded tools' MCP server (`glia_replay::mcp`) on the wire, through
//! rmcp's client over an in-process pipe: `tools/list` gives the recorded
//! tools with their annotations; `tools/call` answers the recorded output
//! of the call the idempotency key in `_meta` names, and an `isError`
//! result naming the call for one the recording lacks or one without a key.

use std::path::Path;

use glia_agent::mcp::IDEMPOTENCY_META_KEY;
use glia_replay::mcp::RecordedToolServer;
use rmcp::ServiceExt;
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResult, ClientRequest, RequestMetaObject,
    ServerResult,
};
use rmcp::service::PeerRequestOptions;
use serde_json::{Value, json};

fn recording() -> glia_replay::Recording {
    glia_replay::tau::load_dir(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/tau-bench-airline"),
    )
    .unwrap()
}

async fn call(
    peer: &rmcp::Peer<rmcp::RoleClient>,
    tool: &str,
    arguments: Value,
    key: Option<&str>,
) -> CallToolResult {
    let Value::Object(arguments) = arguments else {
        panic!("arguments are an object")
    };
    let mut options = PeerRequestOptions::no_options();
    if let Some(key) = key {
        let mut meta = RequestMetaObject::new();
        meta.0
            .0
            .insert(IDEMPOTENCY_META_KEY.into(), Value::String(key.to_owned()));
        options = options.with_meta(meta);
    }
    let request = ClientRequest::CallToolRequest(CallToolRequest::new(
        CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments),
    ));
    let handle = peer
        .send_request_with_option(request, options)
        .await
        .unwrap();
    match handle.await_response().await.unwrap() {
        ServerResult::CallToolResult(r) => r,
        other => panic!("not a tools/call result: {other:?}"),
    }
}

fn text(r: &CallToolResult) -> String {
    r.content
        .iter()
        .filter_map(|b| serde_json::to_value(b).ok())
        .filter_map(|b| b["text"].as_str().map(str::to_owned))
        .collect()
}

#[tokio::test]
async fn the_recorded_tools_answer_over_mcp_by_the_call_id_in_meta() {
    let recording = recording();
    let (client_io, server_io) = tokio::io::duplex(1 << 20);
    let server = RecordedToolServer::new(&recording);
    tokio::spawn(async move {
        let running = server.serve(server_io).await.unwrap();
        let _ = running.waiting().await;
    });
    let client = ().serve(client_io).await.unwrap();

    let tools = client.peer().list_all_tools().await.unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    assert_eq!(tools.len(), 14, "{names:?}");
    let hint = |name: &str| {
        tools
            .iter()
            .find(|t| t.name == name)
            .and_then(|t| t.annotations.clone())
            .unwrap()
    };
    assert_eq!(hint("get_user_details").read_only_hint, Some(true));
    assert_eq!(
        (
            hint("cancel_reservation").idempotent_hint,
            hint("cancel_reservation").read_only_hint
        ),
        (Some(false), None)
    );

    // The first recorded call of the first conversation, by its id.
    let first = &recording.conversations()[0];
    let recorded = serde_json::to_value(&first.messages).unwrap();
    let (call_id, name, input) = recorded
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|m| m["content"].as_array().cloned().unwrap_or_default())
        .find(|b| b["type"] == "tool_use")
        .map(|b| {
            (
                b["id"].as_str().unwrap().to_owned(),
                b["name"].as_str().unwrap().to_owned(),
                b["input"].clone(),
            )
        })
        .expect("a recorded tool call");
    let answer = call(
        client.peer(),
        &name,
        input.clone(),
        Some(&format!("run:1:{call_id}")),
    )
    .await;
    assert_eq!(answer.is_error, Some(false), "{answer:?}");
    let output = recorded
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|m| m["content"].as_array().cloned().unwrap_or_default())
        .find(|b| b["type"] == "tool_result" && b["tool_use_id"] == call_id.as_str())
        .map(|b| b["content"].as_str().unwrap().to_owned())
        .unwrap();
    assert_eq!(text(&answer), output);

    // Calls the recording lacks are tool errors that say why.
    let other_args = call(
        client.peer(),
        &name,
        json!({"user_id": "nobody_0000"}),
        Some(&format!("run:1:{call_id}")),
    )
    .await;
    assert_eq!(other_args.is_error, Some(true));
    assert!(
        text(&other_args).contains(&format!("the recording has no call {name}#{call_id}")),
        "{}",
        text(&other_args)
    );
    let no_key = call(client.peer(), &name, input, None).await;
    assert_eq!(no_key.is_error, Some(true));
    assert!(
        text(&no_key).contains(IDEMPOTENCY_META_KEY),
        "{}",
        text(&no_key)
    );
    client.cancel().await.unwrap();
}
