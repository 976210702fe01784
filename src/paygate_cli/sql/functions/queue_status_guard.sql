-- before the schema: the deposits, relays and bot_jobs triggers use it.
-- A queue row in a terminal status never changes status by a plain statement, as a terminal lineage
-- never changes (lineage_transition_guard): a bug or a hand-written UPDATE cannot rewrite a finished
-- row. Arguments of the trigger: the queue's start status (the one status rows leave), then the
-- final statuses (their effect is on chain: nothing moves them). A row in any other terminal status
-- (dead: failed, expired, rejected, dead, needs_human, per queue) goes back to the start status only
-- by `paygate replay` (ops/replay.py), in a transaction that declared it: SET LOCAL
-- paygate.replaying = 'on' (as only workers/retention.py sets paygate.archiving).
CREATE OR REPLACE FUNCTION paygate.queue_status_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status IS NOT DISTINCT FROM OLD.status OR OLD.status = TG_ARGV[0] THEN
        RETURN NEW;
    END IF;
    IF OLD.status = ANY (TG_ARGV[1:TG_NARGS - 1]) THEN
        RAISE EXCEPTION '% %: status % is final; it never changes', TG_TABLE_NAME, OLD.id, OLD.status
            USING ERRCODE = 'check_violation';
    END IF;
    IF coalesce(current_setting('paygate.replaying', true), '') <> 'on' OR NEW.status <> TG_ARGV[0] THEN
        RAISE EXCEPTION '% %: status % is terminal; only replay moves it, back to %', TG_TABLE_NAME, OLD.id,
            OLD.status, TG_ARGV[0] USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END
$$;
