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
//! The goal and the latest human turn are never elided
//! ([`glia_proto::repair::protected_turns`]): eliding them would answer a
//! request other than the one the run was given. When bisection narrows the
//! refusal down to one of them, the refusal stands and the answer says which
//! ([`ModelResponse::refused_turn`]); the loop fails the run with it.
//!
//! An elided message keeps its role and its tool-use / tool-result ids, so
//! pairing stays valid; its text, tool input and tool result are replaced by
//! a marked notice ([`glia_proto::marker::Insert::Elided`], see
//! [`glia_proto::repair::elide`]). The answer lists the elided request
//! messages in [`ModelResponse::elided`]; the loop records a `message.elided`
//! event for each, so a resumed run — in any process — sends the elided
//! history. Elisions are also remembered here, so later calls through the
//! same isolator that were not recorded (a planner's, a compactor's) send
//! the repaired message directly. Each [`Elision`] is reported to the
//! [`ElisionObserver`], if any, with the original message.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use glia_proto::provider::{ModelRequest, ModelResponse, Provider, ProviderError};
use glia_proto::repair::protected_turns;
pub use glia_proto::repair::{elide, elision_text};
use glia_proto::{LiveEvent, Message, Pricing, ProtectedTurn, RefusedTurn, Usage};

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

/// What bisection found.
enum Found {
    /// No single message explains the refusal.
    Nothing,
    /// This message, elided.
    Elision(Elision),
    /// A message that is never elided: the refusal stands.
    Protected(RefusedTurn),
}

/// Told about every elision, so it can be recorded.
pub trait ElisionObserver: Send + Sync {
    /// `elision` was applied to a request.
    fn elided(&self, elision: &Elision);
}

fn refused(r: &ModelResponse) -> bool {
    matches!(r.stop_reason.as_str(), "refusal" | "content_filter")
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
        f.debug_struct("RefusalIsolator")
            .field("max_extra_calls", &self.max_extra_calls)
            .finish_non_exhaustive()
    }
}

impl RefusalIsolator {
    /// Wrap `inner`, spending at most 8 extra calls per refusal.
    pub fn new(inner: Arc<dyn Provider>) -> Self {
        RefusalIsolator {
            inner,
            max_extra_calls: 8,
            observer: None,
            known: Mutex::new(HashMap::new()),
        }
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

    /// `request` with the elisions found earlier applied (never to a
    /// protected message), and the indices of the messages they replaced.
    fn repaired(
        &self,
        request: &ModelRequest,
        protected: &[(usize, ProtectedTurn)],
    ) -> (ModelRequest, Vec<usize>) {
        let known = self.known.lock().expect("elision table lock");
        let mut r = request.clone();
        let mut elided = Vec::new();
        for (i, m) in r.messages.iter_mut().enumerate() {
            if protected.iter().any(|(p, _)| *p == i) {
                continue;
            }
            if let Some(e) = known.get(&Self::fingerprint(m)) {
                *m = e.clone();
                elided.push(i);
            }
        }
        (r, elided)
    }

    fn with_elided(request: &ModelRequest, range: std::ops::Range<usize>) -> ModelRequest {
        let mut r = request.clone();
        for m in &mut r.messages[range] {
            *m = elide(m);
        }
        r
    }

    /// Bisect `request` (which was refused with `usage`) for the culprit;
    /// a culprit among `protected` is reported, not elided (nor probed).
    async fn isolate(
        &self,
        request: &ModelRequest,
        refusal: ModelResponse,
        protected: &[(usize, ProtectedTurn)],
    ) -> Result<(ModelResponse, Found), ProviderError> {
        let quiet = |_: LiveEvent| {};
        let mut spent = refusal.usage;
        let mut calls = 0;
        let (mut lo, mut hi) = (0, request.messages.len());
        let mut confirmed = None;
        while hi - lo > 1 && calls < self.max_extra_calls {
            let mid = lo + (hi - lo) / 2;
            let probe = self
                .inner
                .generate(&Self::with_elided(request, lo..mid), &quiet)
                .await?;
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
            return Ok((refusal, Found::Nothing));
        }
        if let Some(&(index, turn)) = protected.iter().find(|(i, _)| *i == lo) {
            return Ok((
                ModelResponse {
                    usage: spent,
                    ..refusal
                },
                Found::Protected(RefusedTurn { index, turn }),
            ));
        }
        let answer = match confirmed {
            Some(a) => a,
            None if calls < self.max_extra_calls => {
                let a = self
                    .inner
                    .generate(&Self::with_elided(request, lo..hi), &quiet)
                    .await?;
                calls += 1;
                spent += a.usage;
                if refused(&a) {
                    return Ok((
                        ModelResponse {
                            usage: spent,
                            ..refusal
                        },
                        Found::Nothing,
                    ));
                }
                a
            }
            None => {
                return Ok((
                    ModelResponse {
                        usage: spent,
                        ..refusal
                    },
                    Found::Nothing,
                ));
            }
        };
        let original = request.messages[lo].clone();
        let elision = Elision {
            index: lo,
            replacement: elide(&original),
            original,
            extra_calls: calls,
            usage: spent,
        };
        Ok((
            ModelResponse {
                usage: spent,
                ..answer
            },
            Found::Elision(elision),
        ))
    }
}

#[async_trait::async_trait]
impl Provider for RefusalIsolator {
    /// The answer to `request` (with known elisions applied); after a
    /// refusal, the answer to the request with the culprit elided. The
    /// answer's `retries` are the first call's; its `elided` lists every
    /// request message replaced. A refusal of the goal or the latest human
    /// turn stands, with [`ModelResponse::refused_turn`] set. Listeners are
    /// told to discard the streamed refusal ([`LiveEvent::ModelDiscard`] with
    /// cause `refusal`) before the new answer's text arrives in one delta.
    async fn generate(
        &self,
        request: &ModelRequest,
        live: &(dyn Fn(LiveEvent) + Send + Sync),
    ) -> Result<ModelResponse, ProviderError> {
        let protected = protected_turns(&request.messages);
        let (request, mut elided) = self.repaired(request, &protected);
        let mut first = self.inner.generate(&request, live).await?;
        if !refused(&first) || request.messages.is_empty() || self.max_extra_calls == 0 {
            first.elided.extend(elided);
            return Ok(first);
        }
        let retries = std::mem::take(&mut first.retries);
        let refused_attempt = u32::try_from(retries.len())
            .unwrap_or(u32::MAX)
            .saturating_add(1);
        let (mut answer, found) = self.isolate(&request, first, &protected).await?;
        if let Found::Protected(turn) = found {
            tracing::warn!(
                index = turn.index,
                turn = turn.turn.describe(),
                "provider refused a message that is never elided; the refusal stands"
            );
            answer.refused_turn = Some(turn);
        }
        if let Found::Elision(e) = &found {
            tracing::warn!(
                index = e.index,
                extra_calls = e.extra_calls,
                "provider refusal isolated; message elided"
            );
            self.known
                .lock()
                .expect("elision table lock")
                .insert(Self::fingerprint(&e.original), e.replacement.clone());
            if let Some(o) = &self.observer {
                o.elided(e);
            }
            elided.push(e.index);
            live(LiveEvent::ModelDiscard {
                attempt: refused_attempt,
                cause: "refusal".into(),
            });
            let text = answer.message.text();
            if !text.is_empty() {
                live(LiveEvent::ModelDelta {
                    channel: "text".into(),
                    delta: text,
                });
            }
        }
        elided.sort_unstable();
        elided.dedup();
        answer.retries = retries;
        answer.elided = elided;
        Ok(answer)
    }

    fn pricing(&self, model: &str) -> Option<Pricing> {
        self.inner.pricing(model)
    }
}
