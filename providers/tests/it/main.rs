//! glia-providers' integration tests, one test binary: adapter, retry,
//! config, price and refusal tests against fixture files and a local HTTP
//! server, and the loop driven through each adapter (see `tests/README.md`).

mod common;

mod anthropic;
mod config;
mod grammar;
mod judge;
mod openai;
mod pricing;
mod refusal;
mod retry;

mod agent_loop;
mod edit_prop;
#[cfg(feature = "redis")]
mod ratelimit;
mod refused_goal;
mod split;
mod tool_arguments;

use common::{Deltas, chunked, fixture};
use glia_agent::provider::ModelResponse;
use glia_proto::LiveEvent;
use glia_providers::error::CallError;

/// Decode a fixture stream in one chunk with `decode`, collecting deltas.
pub fn decode_fixture<F>(path: &str, decode: F) -> (Result<ModelResponse, CallError>, Deltas)
where
    F: for<'a> Fn(
        glia_providers::http::ByteStream<'static>,
        &'a (dyn Fn(LiveEvent) + Send + Sync),
    ) -> futures::future::BoxFuture<'a, Result<ModelResponse, CallError>>,
{
    let bytes = fixture(path);
    let deltas = Deltas::default();
    let result = {
        let live = |e: LiveEvent| deltas.push(e);
        futures::executor::block_on(decode(chunked(&bytes, &[]), &live))
    };
    (result, deltas)
}
