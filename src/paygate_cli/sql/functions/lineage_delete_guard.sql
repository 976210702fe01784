-- before the schema: a lineages trigger uses it.
-- The journal stays append-only for everyone but the archiving statement: a lineage row may be
-- deleted only when it is terminal and the transaction has declared it is archiving
-- (SET LOCAL paygate.archiving = 'on', which only workers/retention.py does, in the same statement
-- that copies the row into paygate_archive.lineages). A bug or a hand-written DELETE still fails.
CREATE OR REPLACE FUNCTION paygate.lineage_delete_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF coalesce(current_setting('paygate.archiving', true), '') = 'on'
       AND OLD.state IN ('applied', 'failed', 'expired', 'superseded', 'abandoned') THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'rows of % are never deleted (the journal is the evidence); terminal ones are archived by the retention worker',
        TG_TABLE_NAME USING ERRCODE = 'insufficient_privilege';
END
$$;
