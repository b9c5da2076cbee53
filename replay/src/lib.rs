//! Replays recorded agent conversations through glia.
//!
//! A [`Recording`] holds conversations recorded elsewhere (today: the
//! tau-bench airline trajectories, read by [`tau`]) in glia's own shapes. A
//! run replays one of them when its model is `replay:{id}`:
//!
//! - [`ReplayProvider`] serves the conversation's model turns in order and
//!   checks every request against the recording first (system prompt, tools
//!   offered, every message: text, tool call ids and arguments, tool
//!   results). On any difference the call fails with
//!   [`glia_proto::provider::ProviderError::Diverged`] naming the first
//!   differing message, and the run fails with it.
//! - [`Recording::tools`] gives one [`RecordedTool`] per recorded tool: a call
//!   returns the output recorded for that call (same call id, tool and
//!   arguments), or fails when there is none.
//! - [`Conversation::customer_move`] tells a driver what the customer does
//!   when the run waits for them: say the next recorded message, or close the
//!   run (with the customer's last words) when the recording ends.
//!
//! Nothing here calls a network; the provider and the tools are stateless, so
//! any worker, after any crash, answers a run the same way.
//!
//! ```
//! let recording = glia_replay::tau::load_dir(std::path::Path::new("../examples/tau-bench-airline")).unwrap();
//! assert_eq!(recording.conversations().len(), 200);
//! let first = &recording.conversations()[0];
//! let config = recording.run_config(first);
//! assert_eq!(config.model, format!("replay:{}", first.id));
//! ```

pub mod mcp;
mod provider;
mod recording;
pub mod tau;
mod tools;

pub use provider::ReplayProvider;
pub use recording::{Conversation, CustomerMove, Recording, RecordingError, describe};
pub use tools::RecordedTool;
