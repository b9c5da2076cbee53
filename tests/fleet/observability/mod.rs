//! Observability: a real Prometheus scrapes the fleet; every dashboard and
//! alert expression returns data. A real OTLP receiver (Arize Phoenix)
//! holds each run's spans as one GenAI trace whose id is the run id.

mod prometheus;
mod traces;
