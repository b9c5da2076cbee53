//! glia-backends' integration tests: one test binary, a module per
//! concern (see `tests/README.md`).

mod budget;
mod memory;
mod postgres;
mod rabbitmq;
mod redis_ledger;
mod sqlite;
mod tenant_usage;
