-- Liveness of the money paths.

-- Allocation takes the least recently used free lane, so no lane is everyone's first choice (a bad
-- lane picked first by every allocator stalls a whole queue).
ALTER TABLE paygate.lanes ADD COLUMN last_allocated_at timestamptz;
CREATE INDEX lanes_lru ON paygate.lanes (last_allocated_at NULLS FIRST, address) WHERE status = 'active';

-- A transaction carrying a user's authorisation is bounded by the authorisation's expiration
-- ledger (the last ledger in which it may apply): once a closed ledger is past it, the lineage is
-- provably dead by ledger, as maxTime proves it by time.
ALTER TABLE paygate.lineages ADD COLUMN max_ledger integer CHECK (max_ledger > 0);
-- The trigger (0002) forbids rewriting a signed envelope; its ledger bound belongs to it too.
CREATE FUNCTION paygate.lineage_max_ledger_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.state <> 'allocated' AND NEW.max_ledger IS DISTINCT FROM OLD.max_ledger THEN
        RAISE EXCEPTION 'lineage %: a signed envelope is never replaced', OLD.id USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER lineage_max_ledger_guard BEFORE UPDATE ON paygate.lineages
    FOR EACH ROW EXECUTE FUNCTION paygate.lineage_max_ledger_guard();
