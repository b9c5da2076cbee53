//! The API's promises on the real adapters (Postgres, RabbitMQ, Redis):
//! admission compiles every JSON Schema a run carries and names the field it
//! refuses; once a cancel is posted, no other payload is taken (409
//! `run_cancelled`), on every payload endpoint; edited approval arguments
//! are checked against the tool's schema.

use crate::common;

use axum::http::StatusCode;
use common::*;
use glia_backends::{EventLog, Inbox, RunFilter, RunLog};
use glia_proto::{Payload, ToolSpec};
use serde_json::{Value, json};

fn external(name: &str, input_schema: Value) -> Value {
    json!({"name": name, "description": "d", "input_schema": input_schema})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_compiles_every_schema_and_names_the_field() {
    let real = Real::start().await;
    let ok = json!({"type": "object", "properties": {"q": {"type": "string"}}});
    for (config, field, why) in [
        (
            json!({"external_tools": [external("fine", ok.clone()), external("ext", json!({"type": "notatype", "properties": 5, "required": "x"}))]}),
            "config.external_tools[1].input_schema",
            "not a valid JSON Schema",
        ),
        (
            json!({"output_schema": {"type": "bogus", "$ref": "#/nope"}}),
            "config.output_schema",
            "not a valid JSON Schema",
        ),
        (
            json!({"output_schema": {"properties": {"a": {"type": "string"}}}}),
            "config.output_schema",
            "must describe a JSON object",
        ),
        (
            json!({"output_schema": {"type": "object", "properties": {"a": {"type": "bogus"}}}}),
            "config.output_schema",
            "not a valid JSON Schema",
        ),
        (
            json!({"output_schema": {"type": "object", "$ref": "#/$defs/missing"}}),
            "config.output_schema",
            "not a valid JSON Schema",
        ),
        // References to other documents are never fetched or read.
        (
            json!({"external_tools": [external("web", json!({"type": "object", "$ref": "http://127.0.0.1:9/schema.json"}))]}),
            "config.external_tools[0].input_schema",
            "not a valid JSON Schema",
        ),
        (
            json!({"external_tools": [external("file", json!({"type": "object", "$ref": "file:///etc/passwd"}))]}),
            "config.external_tools[0].input_schema",
            "not a valid JSON Schema",
        ),
        // Tool arguments are a JSON object in both provider APIs.
        (
            json!({"external_tools": [external("arr", json!({"type": "array"}))]}),
            "config.external_tools[0].input_schema",
            "must describe a JSON object",
        ),
        (
            json!({"external_tools": [external("bool", json!(true))]}),
            "config.external_tools[0].input_schema",
            "must be a JSON Schema object",
        ),
        (
            json!({"output_schema": "a string"}),
            "config.output_schema",
            "must be a JSON Schema object",
        ),
        (
            json!({"external_tools": [external("final_output", ok.clone())]}),
            "config.external_tools[0].name",
            "reserved",
        ),
        (
            json!({"external_tools": [external("twice", ok.clone()), external("twice", ok.clone())]}),
            "config.external_tools[1].name",
            "listed twice",
        ),
        (
            json!({"policies": [{"tool": "x", "args": "(unclosed", "action": {"kind": "allow"}}]}),
            "config.policies[0].args",
            "not a valid regex",
        ),
    ] {
        let r = real
            .post(
                "/v1/runs",
                SUB_A,
                json!({"goal": "schema", "config": config}),
            )
            .await;
        assert_eq!(
            r.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{config}: {}",
            r.text
        );
        // The OpenAPI document's schema refuses some (`invalid_body`, naming the
        // place inside the field); compiling the schema, the others.
        let at = r.body["error"]["field"]
            .as_str()
            .unwrap_or_else(|| panic!("no field: {}", r.text));
        assert!(at.starts_with(field), "{at} is not in {field}: {}", r.text);
        if r.code() == "invalid_request" {
            let message = r.body["error"]["message"].as_str().unwrap();
            assert!(
                message.starts_with(&format!("{field}: ")) && message.contains(why),
                "{message}"
            );
        } else {
            assert_eq!(r.code(), "invalid_body", "{}", r.text);
        }
    }
    let runs = real
        .log
        .list_runs(&RunFilter {
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(runs.is_empty(), "nothing was admitted: {runs:?}");
    // The same schemas, valid, are admitted.
    real.create(SUB_A, json!({"goal": "ok", "config": {"external_tools": [external("fine", ok.clone())], "output_schema": ok}})).await;
    real.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_cancel_every_payload_endpoint_answers_409() {
    let real = Real::start().await;
    let log: &dyn EventLog = &*real.log;
    let approval = real.create(SUB_B, json!({"goal": "refund"})).await;
    park_for_approval(log, approval, &[("c1", "refund", json!({"amount": 1}))]).await;
    let tool = real.create(SUB_B, json!({"goal": "look up"})).await;
    park_for_tool(log, tool).await;
    let chat = real.create(SUB_B, conversational()).await;
    park_for_input(log, chat).await;
    let paused = real.create(SUB_B, json!({"goal": "spend"})).await;
    park_paused(log, paused, true).await;
    for id in [approval, tool, chat, paused] {
        let r = real
            .post(
                &format!("/v1/runs/{id}/cancel"),
                SUB_B,
                json!({"reason": "stop"}),
            )
            .await;
        assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text);
    }
    for (uri, body) in [
        (
            format!("/v1/runs/{approval}/approvals/c1"),
            json!({"decision": "approve"}),
        ),
        (
            format!("/v1/runs/{tool}/tool-results/ext1"),
            json!({"content": "sunny"}),
        ),
        (
            format!("/v1/runs/{chat}/messages"),
            json!({"text": "one more thing"}),
        ),
        (format!("/v1/runs/{chat}/close"), json!({})),
        (
            format!("/v1/runs/{paused}/resume"),
            json!({"extend": {"max_turns": 5}}),
        ),
        (format!("/v1/runs/{paused}/close"), json!({})),
    ] {
        let r = real.post(&uri, SUB_B, body).await;
        assert_eq!(
            (r.status, r.code()),
            (StatusCode::CONFLICT, "run_cancelled"),
            "{uri}: {}",
            r.text
        );
    }
    let bulk = real
        .post(
            "/v1/approvals",
            SUB_B,
            json!({"decisions": [{"run_id": approval, "call_id": "c1", "decision": "reject"}]}),
        )
        .await;
    assert_eq!(bulk.status, StatusCode::OK, "{}", bulk.text);
    assert_eq!(
        (
            bulk.body["results"][0]["status"].as_u64(),
            bulk.body["results"][0]["error"]["code"].as_str()
        ),
        (Some(409), Some("run_cancelled"))
    );
    // Each inbox holds the cancel and nothing else; a second cancel is the same one.
    for id in [approval, tool, chat, paused] {
        let inbox = real.log.inbox(id).await.unwrap();
        assert_eq!(
            inbox.iter().map(|i| &i.payload).collect::<Vec<_>>(),
            [&Payload::Cancel {
                reason: "stop".into()
            }],
            "{id}"
        );
        let again = real
            .post(&format!("/v1/runs/{id}/cancel"), SUB_B, json!({}))
            .await;
        assert_eq!(
            (again.status, &again.body["inbox_ids"]),
            (StatusCode::ACCEPTED, &json!([inbox[0].id])),
            "{}",
            again.text
        );
    }
    real.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edited_arguments_must_match_the_tools_schema() {
    let real = Real::start().await;
    let schema = json!({"type": "object", "properties": {"amount": {"type": "integer"}}, "required": ["amount"], "additionalProperties": false});
    let spec = ToolSpec {
        external: true,
        ..ToolSpec::new("refund", "Refund an order.", schema)
    };
    let id = real
        .create(
            SUB_B,
            json!({"goal": "refund", "config": {"external_tools": [spec]}}),
        )
        .await;
    park_for_approval_with_tools(
        &*real.log,
        id,
        &[("c1", "refund", json!({"amount": 1}))],
        vec![spec.clone()],
    )
    .await;
    let bad = real
        .post(
            &format!("/v1/runs/{id}/approvals/c1"),
            SUB_B,
            json!({"decision": "edit", "input": {"amount": "all of it"}}),
        )
        .await;
    assert_eq!(
        (bad.status, bad.code()),
        (StatusCode::UNPROCESSABLE_ENTITY, "invalid_request"),
        "{}",
        bad.text
    );
    assert_eq!(bad.body["error"]["field"], "input");
    assert!(
        bad.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("\"all of it\" is not of type \"integer\""),
        "{}",
        bad.text
    );
    assert!(
        real.log.inbox(id).await.unwrap().is_empty(),
        "nothing was posted"
    );
    let good = real
        .post(
            &format!("/v1/runs/{id}/approvals/c1"),
            SUB_B,
            json!({"decision": "edit", "input": {"amount": 2}}),
        )
        .await;
    assert_eq!(good.status, StatusCode::ACCEPTED, "{}", good.text);
    real.cleanup().await;
}
