//! The tenant of a run, for the loop's HTTP hooks (`tenants` filters of the
//! operator's catalogue, the `tenant` of a hook's request) and the budget
//! gate's tenant caps: read from the run's summary in the event log once,
//! then remembered.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use glia_agent::http_hooks::RunTenants;
use glia_backends::EventLog;
use uuid::Uuid;

/// Runs whose tenant a [`LogTenants`] remembers before it forgets them all.
const REMEMBERED: usize = 100_000;

/// [`RunTenants`] over the event log (`EventLog::get_run`).
pub struct LogTenants {
    log: Arc<dyn EventLog>,
    known: Mutex<HashMap<Uuid, String>>,
}

impl LogTenants {
    /// Read tenants from `log`.
    pub fn new(log: Arc<dyn EventLog>) -> Self {
        LogTenants {
            log,
            known: Mutex::new(HashMap::new()),
        }
    }
}

#[async_trait]
impl RunTenants for LogTenants {
    async fn tenant(&self, run_id: Uuid) -> Result<String, String> {
        if let Some(t) = self
            .known
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&run_id)
        {
            return Ok(t.clone());
        }
        let tenant = self
            .log
            .get_run(run_id)
            .await
            .map_err(|e| format!("the run's tenant could not be read: {e}"))?
            .tenant;
        let mut known = self.known.lock().unwrap_or_else(|e| e.into_inner());
        if known.len() >= REMEMBERED {
            known.clear();
        }
        known.insert(run_id, tenant.clone());
        Ok(tenant)
    }
}
