//! Every fixture stream decodes to the same answer and the same live deltas
//! however the bytes are cut: at every single byte boundary (two chunks),
//! and at many random multi-cut splits (seeded, so failures reproduce).

use crate::common;

use common::{Deltas, chunked, fixture};
use glia_agent::provider::ModelResponse;
use glia_proto::LiveEvent;
use glia_providers::error::CallError;
use glia_providers::http::ByteStream;
use glia_providers::{anthropic, openai};

/// The answer, and the deltas of each channel: text, thinking, tool calls
/// begun (their names, one after another).
type Decoded = (Result<ModelResponse, CallError>, String, String, String);

fn decode(kind: &str, stream: ByteStream<'static>) -> Decoded {
    let deltas = Deltas::default();
    let live = |e: LiveEvent| deltas.push(e);
    let result = futures::executor::block_on(async {
        match kind {
            "anthropic" => anthropic::decode_stream(stream, &live).await,
            _ => openai::decode_stream(stream, &live).await,
        }
    });
    (
        result,
        deltas.joined("text"),
        deltas.joined("thinking"),
        deltas.joined("tool_call"),
    )
}

fn fixtures(kind: &str) -> Vec<String> {
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(kind);
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".sse"))
        .collect();
    names.sort();
    names
}

/// Fixtures longer than this are checked at a dense sample of boundaries.
const EVERY_BOUNDARY_UP_TO: usize = 6000;

fn check(kind: &str) {
    let names = fixtures(kind);
    assert!(
        names.len() >= 10,
        "{kind}: expected the fixture set, found {names:?}"
    );
    let mut rng = fastrand::Rng::with_seed(0x6c1a);
    for name in names {
        let bytes = fixture(&format!("{kind}/{name}"));
        let whole = decode(kind, chunked(&bytes, &[]));
        // Ids made up for servers that send none differ per decode; none of these fixtures lacks one.
        let positions: Vec<usize> = if bytes.len() <= EVERY_BOUNDARY_UP_TO {
            (1..bytes.len()).collect()
        } else {
            (0..EVERY_BOUNDARY_UP_TO)
                .map(|_| rng.usize(1..bytes.len()))
                .collect()
        };
        for k in positions {
            let split = decode(kind, chunked(&bytes, &[k]));
            assert_eq!(split, whole, "{kind}/{name} split at byte {k}");
        }
        for _ in 0..300 {
            let mut cuts: Vec<usize> = (0..rng.usize(2..12))
                .map(|_| rng.usize(1..bytes.len()))
                .collect();
            cuts.sort_unstable();
            cuts.dedup();
            let split = decode(kind, chunked(&bytes, &cuts));
            assert_eq!(split, whole, "{kind}/{name} split at {cuts:?}");
        }
        // One byte per chunk: every multi-byte character arrives in pieces.
        let all: Vec<usize> = (1..bytes.len()).collect();
        assert_eq!(
            decode(kind, chunked(&bytes, &all)),
            whole,
            "{kind}/{name} byte by byte"
        );
    }
}

#[test]
fn anthropic_fixtures_decode_the_same_at_every_byte_boundary() {
    check("anthropic");
}

#[test]
fn openai_fixtures_decode_the_same_at_every_byte_boundary() {
    check("openai");
}
