//! The recorded tools served over MCP: `glia replay-tools DIR` runs
//! [`serve_stdio`] as a catalogue's stdio server, so a replayed batch calls
//! its tools in a separate process, through the worker's MCP client, as a
//! fleet calls a team's real tool server.
//!
//! `tools/list` gives the recording's tools (name, description, input
//! schema; idempotent ones are annotated `readOnlyHint`, the others — the
//! consequential tools — `idempotentHint: false`). `tools/call` answers the
//! output recorded for the call: the call id is the last part of the
//! idempotency key in `_meta` (`glia/idempotency_key` =
//! `{run_id}:{turn}:{call_id}`, `glia_agent::mcp::IDEMPOTENCY_META_KEY`),
//! matched with the tool name and the canonical arguments, as
//! [`crate::RecordedTool`] matches them. A call the recording lacks, or one
//! without the key, is an `isError` result naming it. Protocol: the MCP
//! specification's `tools/list` and `tools/call`
//! (<https://modelcontextprotocol.io/specification>), on `rmcp`.

use std::collections::HashMap;
use std::sync::Arc;

use glia_agent::mcp::IDEMPOTENCY_META_KEY;
use glia_proto::{RunConfig, ToolPolicy, ToolSpec, canonical_json};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ListToolsResult,
    PaginatedRequestParams, RequestMetaObject, ServerCapabilities, ServerConfig, Tool,
    ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde_json::Value;

use crate::Recording;
use crate::recording::Conversation;
use crate::tools::CallKey;

/// The MCP server of a recording's tools (see the module doc).
#[derive(Clone)]
pub struct RecordedToolServer {
    tools: Arc<Vec<ToolSpec>>,
    outputs: Arc<HashMap<CallKey, String>>,
}

impl RecordedToolServer {
    /// The server of `recording`'s tools.
    pub fn new(recording: &Recording) -> Self {
        RecordedToolServer {
            tools: Arc::new(recording.tools.clone()),
            outputs: recording.outputs.clone(),
        }
    }

    fn listed(spec: &ToolSpec) -> Tool {
        let schema = match &spec.input_schema {
            Value::Object(o) => o.clone(),
            _ => serde_json::Map::new(),
        };
        let hints = if spec.idempotent {
            ToolAnnotations::new().read_only(true)
        } else {
            ToolAnnotations::new().destructive(false).idempotent(false)
        };
        Tool::new(
            spec.name.clone(),
            spec.description.clone(),
            Arc::new(schema),
        )
        .with_annotations(hints)
    }

    /// The recorded output of a `tools/call` whose `_meta` is `meta`, or why
    /// there is none.
    fn answer(
        &self,
        request: &CallToolRequestParams,
        meta: &RequestMetaObject,
    ) -> Result<String, String> {
        let key = meta
            .0
            .0
            .get(IDEMPOTENCY_META_KEY)
            .or_else(|| {
                request
                    .meta
                    .as_ref()
                    .and_then(|m| m.0.0.get(IDEMPOTENCY_META_KEY))
            })
            .and_then(Value::as_str);
        let Some(call_id) = key.and_then(|k| k.splitn(3, ':').nth(2)) else {
            return Err(format!(
                "a recorded tool needs the call's idempotency key in _meta ({IDEMPOTENCY_META_KEY}: run:turn:call)"
            ));
        };
        let arguments = Value::Object(request.arguments.clone().unwrap_or_default());
        let key = (
            call_id.to_owned(),
            request.name.to_string(),
            canonical_json(&arguments),
        );
        self.outputs.get(&key).cloned().ok_or_else(|| {
            format!(
                "the recording has no call {}#{} with arguments {}",
                key.1, key.0, key.2
            )
        })
    }
}

impl ServerHandler for RecordedToolServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn list_tools(
        &self,
        _: Option<PaginatedRequestParams>,
        _: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(
            self.tools.iter().map(Self::listed).collect(),
        ))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        if !self.tools.iter().any(|t| t.name == request.name) {
            return Err(ErrorData::invalid_params(
                format!("no tool {:?}", request.name),
                None,
            ));
        }
        Ok(match self.answer(&request, &context.meta) {
            Ok(output) => CallToolResult::success(vec![ContentBlock::text(output)]),
            Err(why) => CallToolResult::error(vec![ContentBlock::text(why)]),
        }
        .into())
    }
}

/// Serve `recording`'s tools on stdin/stdout until the client closes them.
/// Errors: the MCP handshake or transport failed (rmcp's error, as text).
pub async fn serve_stdio(recording: &Recording) -> Result<(), String> {
    let service = RecordedToolServer::new(recording)
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| e.to_string())?;
    service.waiting().await.map_err(|e| e.to_string())?;
    Ok(())
}

impl Recording {
    /// [`Recording::run_config`] with the recorded tools taken from the
    /// catalogue MCP server `server` (one running [`serve_stdio`]) instead
    /// of the worker's registry: every recorded tool allowed, the hand-off
    /// tools `return_direct` by `tool_policy`, approvals by the same
    /// policies. The replay provider sees the same tools either way.
    pub fn mcp_run_config(&self, conversation: &Conversation, server: &str) -> RunConfig {
        let mut config = self.run_config(conversation);
        config.tools = Some(Vec::new());
        config.mcp = vec![glia_proto::McpToolSource {
            server: server.to_owned(),
            allow: self.tools.iter().map(|t| t.name.clone()).collect(),
        }];
        for spec in self.tools.iter().filter(|t| t.return_direct) {
            config.tool_policy.insert(
                spec.name.clone(),
                ToolPolicy {
                    return_direct: Some(true),
                    ..ToolPolicy::default()
                },
            );
        }
        config
    }
}
