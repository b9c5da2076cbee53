//! Agents as configuration: definitions applied from files with `glia agents
//! apply` (idempotent, bad files refused naming the field before anything is
//! sent) and runs started from them with `glia submit --agent`.

mod apply;
