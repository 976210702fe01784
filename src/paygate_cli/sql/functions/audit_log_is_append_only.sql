-- before the schema: the audit_log triggers use it.
-- audit_log is append-only: its triggers refuse UPDATE, DELETE and TRUNCATE, even for the owner.
CREATE OR REPLACE FUNCTION paygate.audit_log_is_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit_log is append-only (% refused)', TG_OP USING ERRCODE = 'insufficient_privilege';
END
$$;
