//! [`Waits`] on Postgres (migration `V15__waits.sql`): due waits and event
//! waiters are read from the run rows' pull points by partial indexes;
//! events are kept in `wait_events`.

use async_trait::async_trait;
use glia_proto::ArrivedEvent;
use uuid::Uuid;

use super::{PgLog, col, corrupt, unavailable};
use crate::{DueWait, LogError, Waits};

const DUE: &str = "SELECT id, due FROM ( \
      SELECT id, (pull_point->>'wake_at_ms')::bigint AS due FROM runs \
      WHERE status = 'parked' AND (pull_point->>'kind') = 'awaiting_timer' \
        AND (pull_point->>'wake_at_ms')::bigint <= $1 \
      UNION ALL \
      SELECT id, (pull_point->>'timeout_at_ms')::bigint AS due FROM runs \
      WHERE status = 'parked' AND (pull_point->>'kind') = 'awaiting_event' \
        AND (pull_point->>'timeout_at_ms')::bigint <= $1) d \
    WHERE NOT EXISTS (SELECT 1 FROM inbox i WHERE i.run_id = d.id AND i.dedupe_key = 'wake:' || d.due::text) \
    ORDER BY due, id LIMIT $2";

const DELIVERIES: &str = "SELECT DISTINCT ON (r.id) r.id AS run_id, e.id, e.key, e.payload::text AS payload, e.received_at_ms \
    FROM wait_events e \
    JOIN runs r ON glia_wait_keys(r.pull_point) @> ARRAY[e.key] AND r.tenant = e.tenant \
      AND r.status = 'parked' AND (r.pull_point->>'kind') = 'awaiting_event' \
    WHERE e.received_at_ms >= $1 AND ($2::text IS NULL OR (e.tenant = $2 AND e.id = $3)) \
      AND NOT EXISTS (SELECT 1 FROM inbox i WHERE i.run_id = r.id AND i.dedupe_key = 'event:' || e.id::text) \
      AND NOT EXISTS (SELECT 1 FROM inbox i WHERE i.run_id = r.id AND NOT i.consumed AND i.dedupe_key LIKE 'event:%') \
    ORDER BY r.id, e.received_at_ms, e.id LIMIT $4";

#[async_trait]
impl Waits for PgLog {
    async fn due_waits(&self, now_ms: i64, limit: usize) -> Result<Vec<DueWait>, LogError> {
        self.bounded("due_waits", async {
            let client = self.client().await?;
            let limit = i64::try_from(limit).unwrap_or(i64::MAX);
            let rows = client
                .query(DUE, &[&now_ms, &limit])
                .await
                .map_err(|e| unavailable("due_waits", &e))?;
            rows.iter()
                .map(|r| {
                    Ok(DueWait {
                        run_id: col(r, "id")?,
                        due_at_ms: col(r, "due")?,
                    })
                })
                .collect()
        })
        .await
    }

    async fn keep_event(&self, tenant: &str, event: &ArrivedEvent) -> Result<bool, LogError> {
        self.bounded("keep_event", async {
            let client = self.client().await?;
            let payload = event.payload.to_string();
            let n = client
                .execute(
                    "INSERT INTO wait_events (tenant, id, key, payload, received_at_ms) \
                     VALUES ($1, $2, $3, $4::text::jsonb, $5) ON CONFLICT (tenant, id) DO NOTHING",
                    &[
                        &tenant,
                        &event.id,
                        &event.key,
                        &payload,
                        &event.received_at_ms,
                    ],
                )
                .await
                .map_err(|e| unavailable("keep_event", &e))?;
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
        self.bounded("event_deliveries", async {
            let client = self.client().await?;
            let limit = i64::try_from(limit).unwrap_or(i64::MAX);
            let (tenant, id) = match only {
                Some((t, id)) => (Some(t.to_owned()), Some(id)),
                None => (None, None),
            };
            let rows = client
                .query(DELIVERIES, &[&since_ms, &tenant, &id, &limit])
                .await
                .map_err(|e| unavailable("event_deliveries", &e))?;
            rows.iter()
                .map(|r| {
                    let payload: String = col(r, "payload")?;
                    let payload = serde_json::from_str(&payload)
                        .map_err(|e| corrupt(format!("wait_events payload: {e}")))?;
                    Ok((
                        col(r, "run_id")?,
                        ArrivedEvent {
                            id: col(r, "id")?,
                            key: col(r, "key")?,
                            payload,
                            received_at_ms: col(r, "received_at_ms")?,
                        },
                    ))
                })
                .collect()
        })
        .await
    }

    async fn forget_events(&self, before_ms: i64) -> Result<u64, LogError> {
        self.bounded("forget_events", async {
            let client = self.client().await?;
            client
                .execute(
                    "DELETE FROM wait_events WHERE received_at_ms < $1",
                    &[&before_ms],
                )
                .await
                .map_err(|e| unavailable("forget_events", &e))
        })
        .await
    }
}
