-- Refuses a DELETE (no trigger uses it now: lineage_delete_guard replaced it on lineages).
CREATE OR REPLACE FUNCTION paygate.refuse_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'rows of % are never deleted (the journal is the evidence)', TG_TABLE_NAME
        USING ERRCODE = 'insufficient_privilege';
END
$$;
