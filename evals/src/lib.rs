//! glia-evals: what an eval is, without running one.
//!
//! An **eval** (an experiment) runs every **case** of a **dataset** under
//! one or more agent **versions**, `repetitions` times each, as batches of
//! ordinary runs; then each run (a **cell**: version × case × repetition)
//! is scored by the eval's **graders**, and the cells are summed up per
//! version, compared between versions and reported. This crate holds the
//! pure part of that:
//!
//! - [`dataset`]: a dataset as JSON Lines, parsed strictly (errors name the
//!   line and the field), its canonical form and content hash;
//! - [`spec`]: the eval file (TOML or JSON): dataset, versions, repetitions,
//!   batch options and graders, parsed strictly (errors name the path);
//! - [`grade`](mod@grade): the facts of a finished run (from its events) and the
//!   graders' verdicts on them; an LLM judge or an HTTP grader is returned
//!   as a task for the caller to run, and its answer is read back here;
//! - [`stats`]: pass rates with Wilson intervals, cost and latency
//!   percentiles, majority verdicts per case, verdict changes between
//!   versions, and the gate a CI job applies;
//! - [`report`]: JUnit XML and Markdown;
//! - [`from_run`]: a replay case from a recorded run, its tools answered
//!   from the recording.
//!
//! Pure: no I/O and no async runtime. Money is in USD micros, durations in
//! ms, sizes of model use in tokens.

#![deny(missing_docs)]

pub mod dataset;
pub mod from_run;
pub mod grade;
pub mod report;
pub mod spec;
pub mod stats;

#[cfg(test)]
mod grade_tests;

pub use dataset::{Case, DatasetError, content_hash, parse_jsonl, to_jsonl};
pub use from_run::case_from_run;
pub use grade::{
    Graded, HttpTask, JudgeTask, RunFacts, ToolCallFact, Verdict, cell_pass, grade, http_verdict,
    judge_verdict,
};
pub use report::{junit, markdown};
pub use spec::{
    Approvals, EvalSpec, GraderKind, GraderSpec, Options, SpecError, VersionSpec, parse_json,
    parse_toml,
};
pub use stats::{
    CaseRow, CaseVerdict, Cell, Change, Summary, VersionStats, changes_between, gate, summarize,
    wilson,
};
