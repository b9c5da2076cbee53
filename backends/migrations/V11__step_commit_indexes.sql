-- What a step's commit (`FENCED_COMMIT`) costs should not grow with the
-- fleet. Its `decided` part marks the run's pending approvals decided; the
-- generic plan pooled connections settle on used `approvals_pending` (every
-- tenant's pending approvals, by time) and filtered by run, at every step.
-- This index finds a run's pending approvals directly. (Built without
-- CONCURRENTLY, inside the migration's transaction: on a large history,
-- apply it in a quiet window; writes to approvals wait for the build.)
CREATE INDEX approvals_run_pending ON approvals (run_id) WHERE status = 'pending';

-- The webhook trigger runs its function only for the kinds it forwards (a
-- trigger's WHEN clause is evaluated without calling the function); before,
-- every event of every step called it. The kinds are those of
-- `glia_webhook_enqueue` (V6), which still maps each to its webhook type.
DROP TRIGGER events_webhooks ON events;
CREATE TRIGGER events_webhooks AFTER INSERT ON events
    FOR EACH ROW
    WHEN (NEW.kind IN ('approval.requested', 'approval.escalated', 'approval.resolved', 'session.complete', 'session.cancel'))
    EXECUTE FUNCTION glia_webhook_enqueue();
