-- before the schema: a lineages trigger uses it.
-- lineage_transition_guard forbids rewriting a signed envelope; its ledger bound belongs to it too.
CREATE OR REPLACE FUNCTION paygate.lineage_max_ledger_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.state <> 'allocated' AND NEW.max_ledger IS DISTINCT FROM OLD.max_ledger THEN
        RAISE EXCEPTION 'lineage %: a signed envelope is never replaced', OLD.id USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END
$$;
