-- The restore gate (docs/architecture.md §8 "Disaster recovery"): after a restore from backup or a
-- promotion, the database may be behind the chain. A tick that sees the database's identity change
-- closes submissions with a durable `restore` halt, which only a clean recovery pass clears.

-- A third kind of halt, beside the operator's and the gas monitor's: set by paygate itself when the
-- database went back in time or changed writer; closes admission (every halt does) and submissions
-- (no lane is allocated while it is set: journal/lineage.py free_lane_ctes).
ALTER TABLE paygate.halts DROP CONSTRAINT halts_kind_check,
    ADD CONSTRAINT halts_kind_check CHECK (kind IN ('operator', 'gas', 'restore'));

-- Which database the journal was last known to live in (one row). A restore or a promotion changes
-- at least one of these: a new cluster (system identifier), a new timeline (every promotion and every
-- archive recovery starts one), a recreated database (pg_restore into a new database: its OID). The
-- row itself travels with a dump or a base backup, so after a restore it names the old database.
-- Written by check_db_identity (first record) and by a clean recovery pass (the new identity).
CREATE TABLE paygate.db_identity (
    singleton          boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    system_identifier  text NOT NULL CHECK (system_identifier ~ '^[0-9]+$'),
    timeline           integer NOT NULL CHECK (timeline > 0),
    database_oid       bigint NOT NULL CHECK (database_oid > 0),
    recorded_at        timestamptz NOT NULL DEFAULT now(),
    recorded_by        text NOT NULL CHECK (length(recorded_by) > 0)
);
