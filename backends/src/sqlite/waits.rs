//! [`Waits`] on the single node's file (migration `008_waits.sql`): the
//! Postgres adapter's semantics, which `conformance::waits` checks on both.

use async_trait::async_trait;
use glia_proto::ArrivedEvent;
use rusqlite::params;
use uuid::Uuid;

use super::{SqliteLog, db, get, parse, uuid_of};
use crate::{DueWait, LogError, Waits};

const DUE: &str = "SELECT id, due FROM ( \
      SELECT id, json_extract(pull_point, '$.wake_at_ms') AS due FROM runs \
      WHERE status = 'parked' AND json_extract(pull_point, '$.kind') = 'awaiting_timer' \
        AND json_extract(pull_point, '$.wake_at_ms') <= ?1 \
      UNION ALL \
      SELECT id, json_extract(pull_point, '$.timeout_at_ms') AS due FROM runs \
      WHERE status = 'parked' AND json_extract(pull_point, '$.kind') = 'awaiting_event' \
        AND json_extract(pull_point, '$.timeout_at_ms') <= ?1) d \
    WHERE NOT EXISTS (SELECT 1 FROM inbox i WHERE i.run_id = d.id AND i.dedupe_key = 'wake:' || d.due) \
    ORDER BY due, id LIMIT ?2";

/// Each waiting run's candidate events, oldest first; the first per run is
/// taken in Rust.
const CANDIDATES: &str = "SELECT r.id AS run_id, e.id, e.key, e.payload, e.received_at_ms \
    FROM runs r JOIN wait_events e ON e.tenant = r.tenant \
      AND EXISTS (SELECT 1 FROM json_each(r.pull_point, '$.keys') k WHERE k.value = e.key) \
    WHERE r.status = 'parked' AND json_extract(r.pull_point, '$.kind') = 'awaiting_event' \
      AND e.received_at_ms >= ?1 AND (?2 IS NULL OR (e.tenant = ?2 AND e.id = ?3)) \
      AND NOT EXISTS (SELECT 1 FROM inbox i WHERE i.run_id = r.id AND i.dedupe_key = 'event:' || e.id) \
      AND NOT EXISTS (SELECT 1 FROM inbox i WHERE i.run_id = r.id AND i.consumed = 0 AND i.dedupe_key LIKE 'event:%') \
    ORDER BY r.id, e.received_at_ms, e.id";

#[async_trait]
impl Waits for SqliteLog {
    async fn due_waits(&self, now_ms: i64, limit: usize) -> Result<Vec<DueWait>, LogError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.store
            .read("due_waits", move |conn| {
                let mut st = conn.prepare_cached(DUE).map_err(db("due_waits"))?;
                let mut rows = st.query(params![now_ms, limit]).map_err(db("due_waits"))?;
                let mut out = Vec::new();
                while let Some(row) = rows.next().map_err(db("due_waits"))? {
                    out.push(DueWait {
                        run_id: uuid_of(&get::<String>(row, "id")?, "run id")?,
                        due_at_ms: get(row, "due")?,
                    });
                }
                Ok(out)
            })
            .await
    }

    async fn keep_event(&self, tenant: &str, event: &ArrivedEvent) -> Result<bool, LogError> {
        let tenant = tenant.to_owned();
        let event = event.clone();
        self.store
            .write("keep_event", move |conn| {
                let n = conn
                    .execute(
                        "INSERT INTO wait_events (tenant, id, key, payload, received_at_ms) \
                         VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (tenant, id) DO NOTHING",
                        params![
                            tenant,
                            event.id.to_string(),
                            event.key,
                            event.payload.to_string(),
                            event.received_at_ms
                        ],
                    )
                    .map_err(db("keep_event"))?;
                Ok(n == 1)
            })
            .await
    }

    async fn event_deliveries(
        &self,
        since_ms: i64,
        only: Option<(&str, Uuid)>,
        limit: usize,
    ) -> Result<Vec<(Uuid, ArrivedEvent)>, LogError> {
        let (tenant, id) = match only {
            Some((t, id)) => (Some(t.to_owned()), Some(id.to_string())),
            None => (None, None),
        };
        self.store
            .read("event_deliveries", move |conn| {
                let mut st = conn
                    .prepare_cached(CANDIDATES)
                    .map_err(db("event_deliveries"))?;
                let mut rows = st
                    .query(params![since_ms, tenant, id])
                    .map_err(db("event_deliveries"))?;
                let mut out: Vec<(Uuid, ArrivedEvent)> = Vec::new();
                while let Some(row) = rows.next().map_err(db("event_deliveries"))? {
                    let run_id = uuid_of(&get::<String>(row, "run_id")?, "run id")?;
                    if out.last().is_some_and(|(r, _)| *r == run_id) {
                        continue;
                    }
                    if out.len() >= limit {
                        break;
                    }
                    out.push((
                        run_id,
                        ArrivedEvent {
                            id: uuid_of(&get::<String>(row, "id")?, "event id")?,
                            key: get(row, "key")?,
                            payload: parse(&get::<String>(row, "payload")?, "event payload")?,
                            received_at_ms: get(row, "received_at_ms")?,
                        },
                    ));
                }
                Ok(out)
            })
            .await
    }

    async fn forget_events(&self, before_ms: i64) -> Result<u64, LogError> {
        self.store
            .write("forget_events", move |conn| {
                let n = conn
                    .execute(
                        "DELETE FROM wait_events WHERE received_at_ms < ?1",
                        params![before_ms],
                    )
                    .map_err(db("forget_events"))?;
                Ok(n as u64)
            })
            .await
    }
}
