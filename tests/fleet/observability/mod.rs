//! Observability: a real Prometheus scrapes the fleet; every dashboard and
//! alert expression returns data. A real OTLP receiver (Arize Phoenix)
//! holds each run's spans as one GenAI trace whose id is the run id. The
//! CLI's read commands print runs readably, as JSON, and into `| head`.

mod cli_reads;
mod prometheus;
mod traces;
