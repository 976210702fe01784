-- A tick that found work waiting and could not move it (no free lane for longer than a lineage can
-- live, every lane fenced, ...) ends 'stalled': not a success, so `status` and alerts see it.
ALTER TABLE paygate.worker_runs DROP CONSTRAINT worker_runs_outcome_check;
ALTER TABLE paygate.worker_runs ADD CONSTRAINT worker_runs_outcome_check
    CHECK (outcome IN ('running', 'ok', 'stalled', 'failed', 'needs_human', 'error'));
