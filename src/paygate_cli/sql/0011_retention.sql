-- Retention: terminal history leaves the hot tables. The retention worker
-- (workers/retention.py) moves rows terminal for longer than PAYGATE_RETENTION_WINDOW into
-- paygate_archive (same columns + archived_at) and deletes them from the hot table in the same
-- statement, one bounded batch per transaction. What each table may lose, and why that is safe,
-- is written beside the worker's SQL.

CREATE SCHEMA IF NOT EXISTS paygate_archive;

-- Same columns as the hot table (no identity, defaults, checks or foreign keys: an archived row is
-- a record, not a queue item) + when it was archived. The primary key makes "archived twice"
-- impossible, so a row is in the hot table or in the archive, never both.
CREATE TABLE paygate_archive.charges (LIKE paygate.charges);
ALTER TABLE paygate_archive.charges ADD COLUMN archived_at timestamptz NOT NULL DEFAULT now(),
                                    ADD PRIMARY KEY (id);
CREATE TABLE paygate_archive.charge_batches (LIKE paygate.charge_batches);
ALTER TABLE paygate_archive.charge_batches ADD COLUMN archived_at timestamptz NOT NULL DEFAULT now(),
                                           ADD PRIMARY KEY (lineage_id);
CREATE TABLE paygate_archive.lineages (LIKE paygate.lineages);
ALTER TABLE paygate_archive.lineages ADD COLUMN archived_at timestamptz NOT NULL DEFAULT now(),
                                     ADD PRIMARY KEY (id);
CREATE TABLE paygate_archive.chain_events (LIKE paygate.chain_events);
ALTER TABLE paygate_archive.chain_events ADD COLUMN archived_at timestamptz NOT NULL DEFAULT now(),
                                         ADD PRIMARY KEY (id);
CREATE TABLE paygate_archive.webhook_outbox (LIKE paygate.webhook_outbox);
ALTER TABLE paygate_archive.webhook_outbox ADD COLUMN archived_at timestamptz NOT NULL DEFAULT now(),
                                           ADD PRIMARY KEY (id);
CREATE TABLE paygate_archive.worker_runs (LIKE paygate.worker_runs);
ALTER TABLE paygate_archive.worker_runs ADD COLUMN archived_at timestamptz NOT NULL DEFAULT now(),
                                        ADD PRIMARY KEY (id);
-- Finding an archived row again (an auditor asks about a charge id or a transaction hash).
CREATE INDEX archive_charges_charge_id ON paygate_archive.charges (charge_id);
CREATE INDEX archive_lineages_inner_hash ON paygate_archive.lineages (inner_hash);
CREATE INDEX archive_chain_events_event_id ON paygate_archive.chain_events (event_id);

-- The facts the hot path still needs from archived rows, kept as running totals updated in the
-- statement that archives: the reconciler's contract-wide check counts every settled charge's
-- amount as USDC the billing contract holds, archived or not.
CREATE TABLE paygate.retention_totals (
    singleton               boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    settled_charges_amount  numeric(39,0) NOT NULL DEFAULT 0 CHECK (settled_charges_amount >= 0),
    settled_charges         bigint NOT NULL DEFAULT 0 CHECK (settled_charges >= 0),
    updated_at              timestamptz NOT NULL DEFAULT now()
);
INSERT INTO paygate.retention_totals DEFAULT VALUES;

-- The journal stays append-only for everyone but the archiving statement: a lineage row may be
-- deleted only when it is terminal and the transaction has declared it is archiving
-- (SET LOCAL paygate.archiving = 'on', which only workers/retention.py does, in the same statement
-- that copies the row into paygate_archive.lineages). A bug or a hand-written DELETE still fails.
CREATE FUNCTION paygate.lineage_delete_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF coalesce(current_setting('paygate.archiving', true), '') = 'on'
       AND OLD.state IN ('applied', 'failed', 'expired', 'superseded', 'abandoned') THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'rows of % are never deleted (the journal is the evidence); terminal ones are archived by the retention worker',
        TG_TABLE_NAME USING ERRCODE = 'insufficient_privilege';
END
$$;
DROP TRIGGER lineage_no_delete ON paygate.lineages;
CREATE TRIGGER lineage_no_delete BEFORE DELETE ON paygate.lineages
    FOR EACH ROW EXECUTE FUNCTION paygate.lineage_delete_guard();

-- Retention's own scans: each walks only terminal rows in the order they became terminal, so a
-- batch costs the rows it moves (plus the few kept ones at the head), never a table scan.
CREATE INDEX charges_terminal_at ON paygate.charges ((coalesce(settled_at, failed_at)))
    WHERE status IN ('settled', 'failed');
CREATE INDEX charge_batches_closed ON paygate.charge_batches (closed_at) WHERE closed_at IS NOT NULL;
CREATE INDEX lineages_retention ON paygate.lineages (resolved_at)
    WHERE purpose = 'charge_batch' AND state IN ('applied', 'failed', 'expired', 'superseded', 'abandoned');
CREATE INDEX chain_events_applied_at ON paygate.chain_events (observed_at) WHERE NOT quarantined;
CREATE INDEX webhook_outbox_delivered ON paygate.webhook_outbox (delivered_at) WHERE status = 'delivered';
CREATE INDEX worker_runs_started_at ON paygate.worker_runs (started_at);
-- "Is this row named by an unresolved finding?": open findings are few, so this index stays tiny.
CREATE INDEX findings_open_subject ON paygate.findings (subject) WHERE resolved_at IS NULL;

-- Queue depths every ticking worker writes to the state metrics (ops/status.py, every 30 s per host)
-- that had no partial index of their own: without these they scanned every deposit and relay ever
-- admitted (bench/growth.py prints the plans).
CREATE INDEX deposits_needs_human ON paygate.deposits (updated_at) WHERE status = 'needs_human';
CREATE INDEX relays_needs_human ON paygate.relays (updated_at) WHERE status = 'needs_human';

-- Deleting a lineage makes Postgres check every foreign key that points at it. Without an index on
-- the referencing column that check is a sequential scan of the whole referencing table per deleted
-- lineage (charges, charge_batches and relays already have one).
CREATE INDEX deposits_deposit_lineage ON paygate.deposits (deposit_lineage_id)
    WHERE deposit_lineage_id IS NOT NULL;
CREATE INDEX deposits_credit_lineage ON paygate.deposits (credit_lineage_id)
    WHERE credit_lineage_id IS NOT NULL;
CREATE INDEX fee_reservations_lineage ON paygate.fee_reservations (lineage_id) WHERE lineage_id IS NOT NULL;
CREATE INDEX bot_jobs_lineage ON paygate.bot_jobs (lineage_id) WHERE lineage_id IS NOT NULL;
