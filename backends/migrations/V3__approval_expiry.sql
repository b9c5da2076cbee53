-- Approval deadlines (RunConfig.approval_timeout_ms) and escalation by the
-- reconciler.
ALTER TABLE approvals ADD COLUMN expires_at timestamptz;
ALTER TABLE approvals ADD COLUMN escalated boolean NOT NULL DEFAULT false;
CREATE INDEX approvals_expiring ON approvals (expires_at) WHERE status = 'pending' AND NOT escalated AND expires_at IS NOT NULL;
