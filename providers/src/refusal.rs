//! Refusal isolation: when a provider deterministically refuses (stop reason
//! `refusal`: Anthropic's `refusal`, OpenAI's `content_filter` or `refusal`)
//! because of one message in the history, find that message by bisecting the
//! history with a bounded number of extra calls, replace it with a marked
//! elision, report what was elided, and return the answer to the repaired
//! request.
//!
//! Bisection assumes one culprit: eliding the half that holds it makes the
//! refusal go away. With `n` messages it takes at most ⌈log₂ n⌉ + 1 extra
//! calls (and never more than `max_extra_calls`). If no single message
//! explains the refusal, the original refusal is returned unchanged.
//!
//! An elided message keeps its role and its tool-use / tool-result ids, so
//! pairing stays valid; its text, tool input and tool result are replaced by
//! a marked notice ([`Insert::Summary`] until the marker registry has an
//! elision kind). Elisions are remembered, so later calls through the same
//! isolator send the repaired message directly; the worker should also
//! record each [`Elision`] reported to the [`ElisionObserver`] in the run's
//! log so a resumed run stays repaired.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use glia_proto::marker::Insert;
use glia_proto::{ContentBlock, LiveEvent, Message, Usage};
use glia_worker::provider::{ModelRequest, ModelResponse, Provider, ProviderError};
use serde_json::json;


/// The text that stands for an elided message.
pub fn elision_text() -> String {
    Insert::Summary.wrap("A message was elided here because the model provider refused to process it.")
}

/// One message replaced by an elision.
#[derive(Debug, Clone, PartialEq)]
pub struct Elision {
    /// Its index in the request's `messages`.
    pub index: usize,
    /// The message as it was.
    pub original: Message,
    /// What was sent instead.
    pub replacement: Message,
    /// Calls made beyond the refused one to find it.
    pub extra_calls: usize,
    /// Tokens of every call made for this turn: the refused call, the
    /// probes and the answer (the returned response's usage is this).
    pub usage: Usage,
}

/// Told about every elision, so it can be recorded.
pub trait ElisionObserver: Send + Sync {
    /// `elision` was applied to a request.
    fn elided(&self, elision: &Elision);
}

/// `m` with its content replaced by the elision notice; ids kept.
pub fn elide(m: &Message) -> Message {
    let mut content = Vec::new();
    let mut has_text = false;
    for b in &m.content {
        match b {
            ContentBlock::Text { .. } if !has_text => {
                has_text = true;
                content.push(ContentBlock::text(elision_text()));
            }
            ContentBlock::Text { .. } | ContentBlock::Thinking { .. } => {}
            ContentBlock::ToolUse { id, name, .. } => content.push(ContentBlock::ToolUse { id: id.clone(), name: name.clone(), input: json!({ "elided": true }) }),
            ContentBlock::ToolResult { tool_use_id, is_error, .. } => {
                content.push(ContentBlock::ToolResult { tool_use_id: tool_use_id.clone(), content: elision_text(), is_error: *is_error })
            }
        }
    }
    if content.is_empty() {
        content.push(ContentBlock::text(elision_text()));
    }
    Message { role: m.role, content }
}

fn refused(r: &ModelResponse) -> bool {
    r.stop_reason == "refusal"
}

/// A provider wrapper that isolates and elides refused messages.
pub struct RefusalIsolator {
    inner: Arc<dyn Provider>,
    max_extra_calls: usize,
    observer: Option<Arc<dyn ElisionObserver>>,
    known: Mutex<HashMap<String, Message>>,
}

impl std::fmt::Debug for RefusalIsolator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RefusalIsolator").field("max_extra_calls", &self.max_extra_calls).finish_non_exhaustive()
    }
}

impl RefusalIsolator {
    /// Wrap `inner`, spending at most 8 extra calls per refusal.
    pub fn new(inner: Arc<dyn Provider>) -> Self {
        RefusalIsolator { inner, max_extra_calls: 8, observer: None, known: Mutex::new(HashMap::new()) }
    }

    /// Spend at most `n` extra calls per refusal.
    pub fn with_max_extra_calls(mut self, n: usize) -> Self {
        self.max_extra_calls = n;
        self
    }

    /// Report elisions to `observer`.
    pub fn with_observer(mut self, observer: Arc<dyn ElisionObserver>) -> Self {
        self.observer = Some(observer);
        self
    }

    fn fingerprint(m: &Message) -> String {
        serde_json::to_string(m).unwrap_or_default()
    }

    /// `request` with the elisions found earlier applied.
    fn repaired(&self, request: &ModelRequest) -> ModelRequest {
        let known = self.known.lock().expect("elision table lock");
        let mut r = request.clone();
        for m in &mut r.messages {
            if let Some(e) = known.get(&Self::fingerprint(m)) {
                *m = e.clone();
            }
        }
        r
    }

    fn with_elided(request: &ModelRequest, range: std::ops::Range<usize>) -> ModelRequest {
        let mut r = request.clone();
        for m in &mut r.messages[range] {
            *m = elide(m);
        }
        r
    }

    /// Bisect `request` (which was refused with `usage`) for the culprit.
    async fn isolate(&self, request: &ModelRequest, refusal: ModelResponse) -> Result<(ModelResponse, Option<Elision>), ProviderError> {
        let quiet = |_: LiveEvent| {};
        let mut spent = refusal.usage;
        let mut calls = 0;
        let (mut lo, mut hi) = (0, request.messages.len());
        let mut confirmed = None;
        while hi - lo > 1 && calls < self.max_extra_calls {
            let mid = lo + (hi - lo) / 2;
            let probe = self.inner.generate(&Self::with_elided(request, lo..mid), &quiet).await?;
            calls += 1;
            spent += probe.usage;
            if refused(&probe) {
                lo = mid;
                confirmed = None;
            } else {
                hi = mid;
                confirmed = (hi - lo == 1).then_some(probe);
            }
        }
        if hi - lo != 1 {
            return Ok((refusal, None));
        }
        let answer = match confirmed {
            Some(a) => a,
            None if calls < self.max_extra_calls => {
                let a = self.inner.generate(&Self::with_elided(request, lo..hi), &quiet).await?;
                calls += 1;
                spent += a.usage;
                if refused(&a) {
                    return Ok((ModelResponse { usage: spent, ..refusal }, None));
                }
                a
            }
            None => return Ok((ModelResponse { usage: spent, ..refusal }, None)),
        };
        let original = request.messages[lo].clone();
        let elision = Elision { index: lo, replacement: elide(&original), original, extra_calls: calls, usage: spent };
        Ok((ModelResponse { usage: spent, ..answer }, Some(elision)))
    }
}

#[async_trait::async_trait]
impl Provider for RefusalIsolator {
    async fn generate(&self, request: &ModelRequest, live: &(dyn Fn(LiveEvent) + Send + Sync)) -> Result<ModelResponse, ProviderError> {
        let request = self.repaired(request);
        let first = self.inner.generate(&request, live).await?;
        if !refused(&first) || request.messages.is_empty() || self.max_extra_calls == 0 {
            return Ok(first);
        }
        let (answer, elision) = self.isolate(&request, first).await?;
        if let Some(e) = &elision {
            tracing::warn!(index = e.index, extra_calls = e.extra_calls, "provider refusal isolated; message elided");
            self.known.lock().expect("elision table lock").insert(Self::fingerprint(&e.original), e.replacement.clone());
            if let Some(o) = &self.observer {
                o.elided(e);
            }
            let text = answer.message.text();
            if !text.is_empty() {
                live(LiveEvent::ModelDelta { channel: "text".into(), delta: text });
            }
        }
        Ok(answer)
    }
}
