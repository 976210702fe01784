-- The database's identity now, compared with the one recorded (sql/0004_restore_gate.sql): every
-- tick calls it (ticks/runner.py, in its heartbeat round trip). `p_by`: who asks (worker:instance).
--
-- -> NULL when the identity matches, or when none was recorded yet (it is recorded now: a new
--    deployment, or the first tick after the migration that added the table);
-- -> the reason, when it differs: the `restore` halt is set with that reason (once: an existing
--    restore halt is kept with its first reason) and the recorded identity is left as it was, so
--    every later tick sees the difference too until a clean recovery pass records the new one
--    (journal/restore_gate.py).
-- A standby answers NULL without looking: it cannot be written, and the tick refuses it as "no
-- writer" before it gets here (db/connect.py).
CREATE OR REPLACE FUNCTION paygate.check_db_identity(p_by text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_system text;
    v_timeline integer;
    v_oid bigint;
    v_known paygate.db_identity%ROWTYPE;
    v_why text;
    v_set integer;
BEGIN
    IF pg_is_in_recovery() THEN
        RETURN NULL;
    END IF;
    SELECT n.system_identifier, n.timeline, n.database_oid INTO v_system, v_timeline, v_oid
    FROM paygate.db_identity_now() n;
    SELECT * INTO v_known FROM paygate.db_identity;
    IF NOT FOUND THEN
        INSERT INTO paygate.db_identity (system_identifier, timeline, database_oid, recorded_by)
        VALUES (v_system, v_timeline, v_oid, p_by) ON CONFLICT (singleton) DO NOTHING;
        RETURN NULL;
    END IF;
    IF v_known.system_identifier = v_system AND v_known.timeline = v_timeline AND v_known.database_oid = v_oid THEN
        RETURN NULL;
    END IF;
    v_why := concat_ws('; ',
        CASE WHEN v_known.system_identifier <> v_system
             THEN format('a different cluster (system identifier %s, recorded %s)', v_system, v_known.system_identifier) END,
        CASE WHEN v_known.timeline <> v_timeline
             THEN format('timeline %s, recorded %s (a promotion or a point-in-time restore)', v_timeline, v_known.timeline) END,
        CASE WHEN v_known.database_oid <> v_oid
             THEN format('a recreated database (oid %s, recorded %s: a restore from a dump?)', v_oid, v_known.database_oid) END);
    v_why := format('the database changed since %s: %s; submissions stay closed until a recovery pass '
                    'compares the journal with the chain (paygate recover-check)',
                    to_char(v_known.recorded_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'), v_why);
    INSERT INTO paygate.halts (kind, reason, set_by) VALUES ('restore', left(v_why, 1000), p_by)
    ON CONFLICT (kind) DO NOTHING;
    GET DIAGNOSTICS v_set = ROW_COUNT;
    IF v_set = 1 THEN
        INSERT INTO paygate.audit_log (actor, action, target, details)
        VALUES (p_by, 'restore_halt', 'restore', jsonb_build_object(
            'reason', v_why,
            'recorded', jsonb_build_object('system_identifier', v_known.system_identifier,
                                           'timeline', v_known.timeline, 'database_oid', v_known.database_oid),
            'now', jsonb_build_object('system_identifier', v_system, 'timeline', v_timeline,
                                      'database_oid', v_oid)));
    END IF;
    RETURN v_why;
END $$;
