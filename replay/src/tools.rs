//! Recorded tools: each call returns the output recorded for it.

use std::collections::HashMap;
use std::sync::Arc;

use futures::FutureExt;
use futures::future::BoxFuture;
use glia_agent::tool::{DynTool, ToolContext, ToolFailure};
use glia_proto::{ToolSpec, canonical_json};
use serde_json::Value;

/// What identifies a recorded call: call id, tool name and the canonical
/// JSON of its arguments ([`canonical_json`]).
pub(crate) type CallKey = (String, String, String);

/// A recorded tool: its recorded spec, and the outputs of every recorded call
/// (shared by all tools of a [`crate::Recording`]).
///
/// A call returns the recorded output of the call with the same id, tool and
/// arguments, as is (recorded outputs need not be JSON: `Error: …` texts are
/// results too). A call the recording does not have (arguments an approver
/// edited, say) fails with [`glia_proto::ToolErrorKind::Failed`], and the
/// replay diverges at the next model call.
#[derive(Debug, Clone)]
pub struct RecordedTool {
    spec: ToolSpec,
    outputs: Arc<HashMap<CallKey, String>>,
}

impl RecordedTool {
    pub(crate) fn new(spec: ToolSpec, outputs: Arc<HashMap<CallKey, String>>) -> Self {
        RecordedTool { spec, outputs }
    }
}

impl DynTool for RecordedTool {
    fn spec(&self) -> ToolSpec {
        self.spec.clone()
    }

    fn returns_json(&self) -> bool {
        false
    }

    fn call_raw(
        &self,
        input: Value,
        ctx: ToolContext,
    ) -> BoxFuture<'static, Result<String, ToolFailure>> {
        let key = (ctx.call_id, self.spec.name.clone(), canonical_json(&input));
        let found = self.outputs.get(&key).cloned();
        async move {
            found.ok_or_else(|| {
                ToolFailure::failed(format!(
                    "the recording has no call {}#{} with arguments {}",
                    key.1, key.0, key.2
                ))
            })
        }
        .boxed()
    }
}
