//! Declarative compaction of a run's context before model calls.

use serde::{Deserialize, Serialize};

use crate::config_error::{ConfigError, config_error};

/// Declarative compaction: before a model call whose context is estimated
/// above `max_tokens` (serialised JSON bytes / 4), remove the oldest
/// (assistant, user) turns, keeping the goal and the `keep_recent` latest
/// turns; `summarize` replaces them with a summary the run's model writes.
/// Recorded as `context.compacted`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct CompactionSpec {
    /// `drop_oldest` or `summarize`.
    pub strategy: CompactionStrategy,
    /// Token threshold (estimated); at least 1.
    #[cfg_attr(feature = "schemars", schemars(range(min = 1)))]
    pub max_tokens: u64,
    /// Turns always kept; default 2.
    #[serde(default = "default_keep_recent")]
    pub keep_recent: usize,
}

fn default_keep_recent() -> usize {
    2
}

/// How [`CompactionSpec`] shrinks a context.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum CompactionStrategy {
    /// Remove the oldest turns, leaving a marked note.
    DropOldest,
    /// Summarise the oldest turns through the model.
    Summarize,
}

impl CompactionSpec {
    /// `max_tokens` at least 1. Errors name the field (`max_tokens`).
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.max_tokens == 0 {
            return Err(config_error("max_tokens", "must be at least 1"));
        }
        Ok(())
    }
}
