-- Webhooks (issue 13): per-tenant subscriptions and a durable delivery
-- outbox. A delivery row is written by a trigger in the same transaction as
-- the event that causes it, so a notification exists exactly when its event
-- does, whoever wrote the event; the dispatcher's deliverer sends and retries
-- them. Event types sent: approval.requested, approval.escalated,
-- approval.expired, approval.resolved, run.completed, run.failed.

CREATE TABLE webhook_subscriptions (
    id          uuid PRIMARY KEY,
    tenant      text NOT NULL,
    url         text NOT NULL,
    -- The signing secret (`whsec_…`, Standard Webhooks); never returned after creation.
    secret      text NOT NULL,
    events      text[] NOT NULL,
    format      text NOT NULL CHECK (format IN ('standard', 'slack')),
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX webhook_subscriptions_tenant ON webhook_subscriptions (tenant);

CREATE TABLE webhook_deliveries (
    id               bigserial PRIMARY KEY,
    -- `webhook-id`: the same on every retry of this delivery.
    msg_id           uuid NOT NULL DEFAULT gen_random_uuid() UNIQUE,
    subscription_id  uuid NOT NULL REFERENCES webhook_subscriptions (id) ON DELETE CASCADE,
    tenant           text NOT NULL,
    event_type       text NOT NULL,
    run_id           uuid NOT NULL,
    seq              bigint NOT NULL,
    payload          jsonb NOT NULL,
    status           text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'delivered', 'dead')),
    attempts         integer NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    last_status      integer,
    last_error       text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    delivered_at     timestamptz,
    UNIQUE (subscription_id, run_id, seq)
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at) WHERE status = 'pending';
CREATE INDEX webhook_deliveries_log ON webhook_deliveries (subscription_id, id);

CREATE FUNCTION glia_webhook_enqueue() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_type   text;
    v_tenant text;
    v_data   jsonb;
BEGIN
    v_type := CASE NEW.kind
        WHEN 'approval.requested' THEN 'approval.requested'
        WHEN 'approval.escalated' THEN 'approval.escalated'
        WHEN 'approval.resolved' THEN
            CASE WHEN NEW.payload #>> '{data,decision,kind}' = 'expire' THEN 'approval.expired' ELSE 'approval.resolved' END
        WHEN 'session.complete' THEN
            CASE WHEN NEW.payload #>> '{data,outcome,kind}' = 'succeeded' THEN 'run.completed' ELSE 'run.failed' END
        WHEN 'session.cancel' THEN 'run.failed'
        ELSE NULL
    END;
    IF v_type IS NULL THEN
        RETURN NULL;
    END IF;
    SELECT tenant INTO v_tenant FROM runs WHERE id = NEW.run_id;
    IF NOT EXISTS (SELECT 1 FROM webhook_subscriptions WHERE tenant = v_tenant AND v_type = ANY (events)) THEN
        RETURN NULL;
    END IF;
    -- What a receiver needs to act and link back; tool arguments and model
    -- text stay in the log (the inbox shows them to a signed-in approver).
    v_data := jsonb_strip_nulls(jsonb_build_object(
        'run_id', NEW.run_id,
        'seq', NEW.seq,
        'tenant', v_tenant,
        'call_id', NEW.payload #>> '{data,call_id}',
        'tool', NEW.payload #>> '{data,tool}',
        'expires_at', NEW.payload #>> '{data,expires_at}',
        'interrupted', NEW.payload #> '{data,interrupted}',
        'decision', NEW.payload #>> '{data,decision,kind}',
        'reason', NEW.payload #>> '{data,decision,reason}',
        'decided_by', NEW.payload #>> '{data,by}',
        'outcome', COALESCE(NEW.payload #>> '{data,outcome,kind}', CASE WHEN NEW.kind = 'session.cancel' THEN 'cancelled' END),
        'error', COALESCE(NEW.payload #>> '{data,outcome,error}', NEW.payload #>> '{data,reason}')
    ));
    INSERT INTO webhook_deliveries (subscription_id, tenant, event_type, run_id, seq, payload)
    SELECT s.id, s.tenant, v_type, NEW.run_id, NEW.seq,
           jsonb_build_object('type', v_type, 'timestamp', to_char(NEW.at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'), 'data', v_data)
      FROM webhook_subscriptions s
     WHERE s.tenant = v_tenant AND v_type = ANY (s.events)
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END;
$$;

CREATE TRIGGER events_webhooks AFTER INSERT ON events
    FOR EACH ROW EXECUTE FUNCTION glia_webhook_enqueue();
