-- before the schema: a lineages trigger uses it.
-- Terminal lineages never change, and only the transitions of docs/architecture.md §4 are possible:
-- enforced here too, so a bug or a hand-written UPDATE cannot rewrite history.
CREATE OR REPLACE FUNCTION paygate.lineage_transition_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.state IN ('applied', 'failed', 'expired', 'superseded', 'abandoned') THEN
        RAISE EXCEPTION 'lineage % is terminal (%); it never changes', OLD.id, OLD.state
            USING ERRCODE = 'check_violation';
    END IF;
    IF NEW.state <> OLD.state AND NOT (
           (OLD.state = 'allocated' AND NEW.state IN ('signed', 'abandoned'))
        OR (OLD.state = 'signed' AND NEW.state IN ('sent', 'applied', 'failed', 'expired', 'superseded'))
        OR (OLD.state = 'sent' AND NEW.state IN ('applied', 'failed', 'expired', 'superseded'))) THEN
        RAISE EXCEPTION 'lineage %: % -> % is not a transition', OLD.id, OLD.state, NEW.state
            USING ERRCODE = 'check_violation';
    END IF;
    IF OLD.state <> 'allocated' AND (NEW.inner_hash IS DISTINCT FROM OLD.inner_hash
        OR NEW.source_seq IS DISTINCT FROM OLD.source_seq OR NEW.lane IS DISTINCT FROM OLD.lane
        OR NEW.max_time IS DISTINCT FROM OLD.max_time) THEN
        RAISE EXCEPTION 'lineage %: a signed envelope is never replaced', OLD.id USING ERRCODE = 'check_violation';
    END IF;
    -- The one exception (docs/architecture.md §4 "Fees and the fee market"): a replacement fee bump
    -- around the same inner transaction (checked above), a new outer hash, counted.
    IF OLD.state <> 'allocated' AND (NEW.envelope IS DISTINCT FROM OLD.envelope
        OR NEW.outer_hash IS DISTINCT FROM OLD.outer_hash OR NEW.replacements IS DISTINCT FROM OLD.replacements)
       AND NOT (NEW.state = OLD.state AND NEW.replacements = OLD.replacements + 1
                AND NEW.outer_hash IS DISTINCT FROM OLD.outer_hash AND NEW.envelope IS DISTINCT FROM OLD.envelope) THEN
        RAISE EXCEPTION 'lineage %: a signed envelope is never replaced, but by a replacement fee bump (counted)', OLD.id
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END
$$;
