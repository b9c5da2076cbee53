//! Observability: a real Prometheus scrapes the fleet; every dashboard and
//! alert expression returns data.

mod prometheus;
