-- Foundation: the tables every worker and operator command stands on (docs/architecture.md §2).
-- Queues are plain tables with a status column (CHECK-constrained state machine), lease columns
-- and partial indexes on the claimable rows.

CREATE SCHEMA IF NOT EXISTS paygate;

CREATE TABLE paygate.schema_migrations (
    version     integer PRIMARY KEY,
    name        text NOT NULL,
    checksum    text NOT NULL CHECK (checksum ~ '^[0-9a-f]{64}$'),
    applied_at  timestamptz NOT NULL DEFAULT now(),
    applied_by  text NOT NULL DEFAULT current_user
);

-- Amounts are i128 on chain; numeric(39,0) holds every i128 value exactly.
CREATE TABLE paygate.accounts (
    address         text PRIMARY KEY CHECK (address ~ '^[GC][A-Z2-7]{55}$'),
    cached_balance  numeric(39,0) NOT NULL DEFAULT 0 CHECK (cached_balance >= 0),
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now()
);

-- Written by admission in the same transaction as the effect it guards; swept after expires_at.
CREATE TABLE paygate.idempotency_keys (
    scope         text NOT NULL,
    key           text NOT NULL CHECK (length(key) BETWEEN 1 AND 255),
    request_hash  bytea NOT NULL,
    response      jsonb,
    created_at    timestamptz NOT NULL DEFAULT now(),
    expires_at    timestamptz NOT NULL,
    PRIMARY KEY (scope, key)
);
-- The sweep walks this index in expires_at order: no table scan per batch.
CREATE INDEX idempotency_keys_expires_at ON paygate.idempotency_keys (expires_at);

CREATE TABLE paygate.webhook_endpoints (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    url          text NOT NULL,
    -- HMAC key shared with the customer; never printed by any command.
    secret       text NOT NULL CHECK (length(secret) >= 16),
    enabled      boolean NOT NULL DEFAULT true,
    description  text,
    created_at   timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE paygate.webhook_outbox (
    id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id          uuid NOT NULL DEFAULT gen_random_uuid() UNIQUE,  -- receivers dedupe on it
    -- NULL when the endpoint was deleted: the row goes dead with a reason, never blocks the queue.
    endpoint_id       bigint REFERENCES paygate.webhook_endpoints (id) ON DELETE SET NULL,
    event_type        text NOT NULL,
    payload           jsonb NOT NULL,
    status            text NOT NULL DEFAULT 'pending'
                      CHECK (status IN ('pending', 'delivering', 'delivered', 'dead')),
    attempts          integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    max_attempts      integer CHECK (max_attempts > 0),  -- NULL: the configured default
    next_attempt_at   timestamptz NOT NULL DEFAULT now(),
    lease_token       uuid,
    lease_expires_at  timestamptz,
    claimed_by        text,
    last_status_code  integer,
    last_error        text,
    delivered_at      timestamptz,
    dead_at           timestamptz,
    dead_reason       text,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    CHECK ((status = 'delivering') = (lease_token IS NOT NULL AND lease_expires_at IS NOT NULL)),
    CHECK ((status = 'dead') = (dead_at IS NOT NULL)),
    CHECK ((status = 'delivered') = (delivered_at IS NOT NULL))
);
CREATE INDEX webhook_outbox_due ON paygate.webhook_outbox (next_attempt_at) WHERE status = 'pending';
CREATE INDEX webhook_outbox_leased ON paygate.webhook_outbox (lease_expires_at) WHERE status = 'delivering';
CREATE INDEX webhook_outbox_dead ON paygate.webhook_outbox (dead_at) WHERE status = 'dead';

-- Durable pauses. 'operator' is the on-call engineer's own; 'gas' belongs to the gas monitor.
CREATE TABLE paygate.halts (
    kind    text PRIMARY KEY CHECK (kind IN ('operator', 'gas')),
    reason  text NOT NULL CHECK (length(reason) > 0),
    set_by  text NOT NULL,
    set_at  timestamptz NOT NULL DEFAULT now()
);

-- Append-only: the runtime role may only INSERT/SELECT, and the trigger stops everyone else too.
CREATE TABLE paygate.audit_log (
    id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at       timestamptz NOT NULL DEFAULT now(),
    actor    text NOT NULL,
    action   text NOT NULL,
    target   text,
    details  jsonb NOT NULL DEFAULT '{}'::jsonb
);
CREATE INDEX audit_log_at ON paygate.audit_log (at);

CREATE FUNCTION paygate.audit_log_is_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit_log is append-only (% refused)', TG_OP USING ERRCODE = 'insufficient_privilege';
END
$$;
CREATE TRIGGER audit_log_append_only BEFORE UPDATE OR DELETE ON paygate.audit_log
    FOR EACH ROW EXECUTE FUNCTION paygate.audit_log_is_append_only();
CREATE TRIGGER audit_log_no_truncate BEFORE TRUNCATE ON paygate.audit_log
    FOR EACH STATEMENT EXECUTE FUNCTION paygate.audit_log_is_append_only();

-- One heartbeat row per tick: 'running' at start, finished with the outcome.
CREATE TABLE paygate.worker_runs (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    worker       text NOT NULL,
    instance_id  text NOT NULL,
    slot         integer NOT NULL DEFAULT 0,
    pid          integer NOT NULL,
    started_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    finished_at  timestamptz,
    outcome      text NOT NULL DEFAULT 'running'
                 CHECK (outcome IN ('running', 'ok', 'failed', 'needs_human', 'error')),
    processed    integer NOT NULL DEFAULT 0,
    failed       integer NOT NULL DEFAULT 0,
    error        text,
    CHECK ((outcome = 'running') = (finished_at IS NULL))
);
CREATE INDEX worker_runs_worker_started ON paygate.worker_runs (worker, started_at DESC);
CREATE INDEX worker_runs_last_success ON paygate.worker_runs (worker, finished_at DESC) WHERE outcome = 'ok';

-- Hosts running ticks. A drained instance takes no new work.
CREATE TABLE paygate.instances (
    instance_id   text PRIMARY KEY,
    first_seen    timestamptz NOT NULL DEFAULT now(),
    last_seen     timestamptz NOT NULL DEFAULT now(),
    drained_at    timestamptz,
    drained_by    text,
    drain_reason  text
);
