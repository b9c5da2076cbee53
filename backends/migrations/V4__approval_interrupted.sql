-- An approval asking whether to run a call again that a crash interrupted
-- (RunConfig.on_interrupted_call = require_approval).
ALTER TABLE approvals ADD COLUMN interrupted boolean NOT NULL DEFAULT false;
