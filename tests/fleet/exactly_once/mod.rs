//! Exactly-once effects: the tau-bench recording reproduced call for call,
//! with every approval beyond the recording's an interrupted re-approval.

mod tau_batch;
