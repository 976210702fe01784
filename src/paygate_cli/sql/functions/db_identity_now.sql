-- The database's identity as it is now (sql/0004_restore_gate.sql): the cluster, the timeline the
-- writer writes (the WAL file name's first 8 hex digits; the control file's checkpoint timeline lags
-- a promotion until the first checkpoint after it), and this database's OID. One definition, read by
-- check_db_identity (every tick) and by the recovery pass (journal/restore_gate.py). A standby has
-- no current WAL position: call it on a writer only.
CREATE OR REPLACE FUNCTION paygate.db_identity_now(OUT system_identifier text, OUT timeline integer,
                                                   OUT database_oid bigint)
LANGUAGE sql STABLE AS $$
    SELECT (pg_control_system()).system_identifier::text,
           ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::integer,
           (SELECT oid FROM pg_database WHERE datname = current_database())::bigint
$$;
