-- The schema (docs/architecture.md §2): every table, index, constraint and trigger, grouped by area.
--
-- Functions are not here: each is in sql/functions/<name>.sql, applied by `paygate migrate` after
-- this file and again whenever its file changes (db/migrate.py). The few this file's DDL needs (the
-- trigger functions) are marked in their files and applied before it. A later change to a table is
-- a new numbered migration; a change to a function is an edit of its file.
--
-- Queues are plain tables with a status column (CHECK-constrained state machine), lease columns
-- and partial indexes on the claimable rows. Amounts are i128 on chain; numeric(39,0) holds every
-- i128 value exactly. Functions run with the caller's rights (none is SECURITY DEFINER): EXECUTE is
-- PUBLIC by default, and `migrate --roles` grants every paygate function to the runtime role.

CREATE SCHEMA IF NOT EXISTS paygate;

-- == Bookkeeping of `paygate migrate` ============================================================

CREATE TABLE paygate.schema_migrations (
    version     integer PRIMARY KEY,
    name        text NOT NULL,
    checksum    text NOT NULL CHECK (checksum ~ '^[0-9a-f]{64}$'),
    applied_at  timestamptz NOT NULL DEFAULT now(),
    applied_by  text NOT NULL DEFAULT current_user
);

-- One row per sql/functions/<name>.sql: the checksum of the file as last applied. `migrate`
-- re-applies a file whose checksum differs; a tick refuses to run while any differs (db/migrate.py).
CREATE TABLE paygate.schema_functions (
    name        text PRIMARY KEY CHECK (name ~ '^[a-z0-9_]+$'),
    checksum    text NOT NULL CHECK (checksum ~ '^[0-9a-f]{64}$'),
    applied_at  timestamptz NOT NULL DEFAULT now(),
    applied_by  text NOT NULL DEFAULT current_user
);

-- == Accounts, admission, webhooks, operations ===================================================

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

-- Domain events fanned out per endpoint (emit_event), delivered by the webhooks worker.
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
CREATE INDEX webhook_outbox_delivered ON paygate.webhook_outbox (delivered_at) WHERE status = 'delivered';

-- Durable pauses. 'operator' is the on-call engineer's own; 'gas' belongs to the gas monitor.
CREATE TABLE paygate.halts (
    kind    text PRIMARY KEY CHECK (kind IN ('operator', 'gas')),
    reason  text NOT NULL CHECK (length(reason) > 0),
    set_by  text NOT NULL,
    set_at  timestamptz NOT NULL DEFAULT now()
);

-- Append-only: the runtime role may only INSERT/SELECT, and the triggers stop everyone else too.
CREATE TABLE paygate.audit_log (
    id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at       timestamptz NOT NULL DEFAULT now(),
    actor    text NOT NULL,
    action   text NOT NULL,
    target   text,
    details  jsonb NOT NULL DEFAULT '{}'::jsonb
);
CREATE INDEX audit_log_at ON paygate.audit_log (at);
CREATE TRIGGER audit_log_append_only BEFORE UPDATE OR DELETE ON paygate.audit_log
    FOR EACH ROW EXECUTE FUNCTION paygate.audit_log_is_append_only();
CREATE TRIGGER audit_log_no_truncate BEFORE TRUNCATE ON paygate.audit_log
    FOR EACH STATEMENT EXECUTE FUNCTION paygate.audit_log_is_append_only();

-- One heartbeat row per tick: 'running' at start, finished with the outcome. A tick that found
-- work waiting and could not move it (no free lane for longer than a lineage can live, every lane
-- fenced, ...) ends 'stalled': not a success, so `status` and alerts see it.
CREATE TABLE paygate.worker_runs (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    worker       text NOT NULL,
    instance_id  text NOT NULL,
    slot         integer NOT NULL DEFAULT 0,
    pid          integer NOT NULL,
    started_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    finished_at  timestamptz,
    outcome      text NOT NULL DEFAULT 'running'
                 CONSTRAINT worker_runs_outcome_check
                 CHECK (outcome IN ('running', 'ok', 'stalled', 'failed', 'needs_human', 'error')),
    processed    integer NOT NULL DEFAULT 0,
    failed       integer NOT NULL DEFAULT 0,
    error        text,
    CHECK ((outcome = 'running') = (finished_at IS NULL))
);
CREATE INDEX worker_runs_worker_started ON paygate.worker_runs (worker, started_at DESC);
CREATE INDEX worker_runs_last_success ON paygate.worker_runs (worker, finished_at DESC) WHERE outcome = 'ok';
CREATE INDEX worker_runs_started_at ON paygate.worker_runs (started_at);

-- Hosts running ticks. A drained instance takes no new work.
CREATE TABLE paygate.instances (
    instance_id   text PRIMARY KEY,
    first_seen    timestamptz NOT NULL DEFAULT now(),
    last_seen     timestamptz NOT NULL DEFAULT now(),
    drained_at    timestamptz,
    drained_by    text,
    drain_reason  text
);

-- == The transaction journal (docs/architecture.md §4) ===========================================

-- Lanes: Stellar accounts that supply sequence numbers; one transaction in flight each.
CREATE TABLE paygate.lanes (
    address            text PRIMARY KEY CHECK (address ~ '^G[A-Z2-7]{55}$'),
    status             text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'drained', 'retired')),
    drained_at         timestamptz,
    drained_by         text,
    created_at         timestamptz NOT NULL DEFAULT now(),
    -- Allocation takes the least recently used free lane, so no lane is everyone's first choice (a
    -- bad lane picked first by every allocator stalls a whole queue).
    last_allocated_at  timestamptz,
    drain_reason       text,
    -- The lane's sequence an operator accepted as consumed outside the journal (resolving a
    -- lane_fence finding, accept_lane_fence). journal/lineage.py last_consumed_seq_sql counts it
    -- with the applied/failed lineages.
    accepted_seq       bigint CHECK (accepted_seq >= 0),
    CHECK ((status = 'active') = (drained_at IS NULL))
);
CREATE INDEX lanes_lru ON paygate.lanes (last_allocated_at NULLS FIRST, address) WHERE status = 'active';

-- One lineage = one transaction attempt. States (docs/architecture.md §4):
--   allocated -> signed -> sent -> applied | failed | expired | superseded
--   allocated -> abandoned (never signed: the lane is simply released)
--   signed    -> applied | failed | expired | superseded (resolved before any send was recorded)
CREATE TABLE paygate.lineages (
    id                 bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    purpose            text NOT NULL CHECK (purpose IN ('deposit', 'credit', 'charge_batch', 'relay')),
    -- What this transaction pays for, e.g. 'deposit:42:deposit', 'relay:7', 'bot_job:3'. At most
    -- one live lineage and at most one applied lineage per entitlement (indexes below).
    entitlement        text NOT NULL,
    lane               text NOT NULL REFERENCES paygate.lanes (address),
    state              text NOT NULL DEFAULT 'allocated'
                       CHECK (state IN ('allocated', 'signed', 'sent', 'applied', 'failed', 'expired',
                                        'superseded', 'abandoned')),
    source_seq         bigint CHECK (source_seq > 0),
    key_id             text,
    envelope           bytea,            -- AES-GCM nonce || ciphertext of the fee-bump envelope XDR
    inner_hash         bytea CHECK (length(inner_hash) = 32),
    outer_hash         bytea CHECK (length(outer_hash) = 32),
    max_time           bigint,           -- the inner transaction's maxTime (ledger close time, unix s)
    signed_at_ledger   integer,          -- latest ledger when signed: a NOT_FOUND must cover it
    send_count         integer NOT NULL DEFAULT 0,
    last_send_status   text,
    ledger             integer,          -- where it was included (applied/failed)
    fee_charged        bigint,
    result_code        text,
    resolution         text,             -- how a terminal state was proven
    created_at         timestamptz NOT NULL DEFAULT now(),
    signed_at          timestamptz,
    sent_at            timestamptz,
    resolved_at        timestamptz,
    -- A transaction carrying a user's authorisation is bounded by the authorisation's expiration
    -- ledger (the last ledger in which it may apply): once a closed ledger is past it, the lineage
    -- is provably dead by ledger, as maxTime proves it by time.
    max_ledger         integer CHECK (max_ledger > 0),
    -- An envelope that no longer decrypts (altered or swapped ciphertext) stops its unit for a human
    -- and blocks nothing else (docs/architecture.md §4 "Envelopes are encrypted"). Such a lineage is
    -- PARKED, not terminal: its signed bytes may still be queued somewhere and land, so it is never
    -- called expired or abandoned by guess. It stays live (signed/sent), keeps its lane's one live
    -- slot and its entitlement; resolve still reads its receipt by hash and records what the chain
    -- proves, and only the resend is skipped. The lane is fenced in the statement that parks it.
    parked_at          timestamptz,
    parked_reason      text,
    -- Resends rejected tick after tick (docs/architecture.md §4): on a chain behind the journal (a
    -- reset network, an RPC of another deployment) every resend answers ERROR txBAD_SEQ and no rule
    -- proves the lineage dead before its maxTime. journal/rejections.py counts consecutive
    -- rejections with one code; reaching `repeated_rejection_threshold` opens a
    -- `repeated_rejection` finding on the lane, once.
    rejected_code      text,                                              -- the ERROR code of the latest resends
    rejected_count     integer NOT NULL DEFAULT 0 CHECK (rejected_count >= 0),  -- consecutive resends rejected with it
    first_rejected_at  timestamptz,                                       -- when that run of rejections began
    CHECK (state IN ('allocated', 'abandoned') OR (source_seq IS NOT NULL AND key_id IS NOT NULL
           AND envelope IS NOT NULL AND inner_hash IS NOT NULL AND outer_hash IS NOT NULL
           AND max_time IS NOT NULL AND signed_at_ledger IS NOT NULL)),
    CHECK (state NOT IN ('applied', 'failed') OR ledger IS NOT NULL),
    CONSTRAINT lineages_parked_has_reason CHECK ((parked_at IS NULL) = (parked_reason IS NULL))
);
-- Stellar queues one transaction per source account: at most one live lineage per lane.
CREATE UNIQUE INDEX lineages_one_live_per_lane ON paygate.lineages (lane) WHERE paygate.lineage_is_live(state);
CREATE UNIQUE INDEX lineages_one_live_per_entitlement ON paygate.lineages (entitlement)
    WHERE paygate.lineage_is_live(state);
CREATE UNIQUE INDEX lineages_one_applied_per_entitlement ON paygate.lineages (entitlement)
    WHERE state = 'applied';
CREATE INDEX lineages_entitlement ON paygate.lineages (entitlement);
CREATE INDEX lineages_lane_seq ON paygate.lineages (lane, source_seq);
CREATE UNIQUE INDEX lineages_inner_hash ON paygate.lineages (inner_hash);
CREATE INDEX lineages_key_id ON paygate.lineages (key_id);
-- Retention's scan of the lineages it may archive (see "Retention" below).
CREATE INDEX lineages_retention ON paygate.lineages (resolved_at)
    WHERE purpose = 'charge_batch' AND state IN ('applied', 'failed', 'expired', 'superseded', 'abandoned');
-- Terminal rows never change, only the transitions above are possible, and a signed envelope (with
-- its ledger bound) is never replaced: enforced here too, so a bug or a hand-written UPDATE cannot
-- rewrite history. Only retention's archiving statement may delete, and only terminal rows.
CREATE TRIGGER lineage_transition_guard BEFORE UPDATE ON paygate.lineages
    FOR EACH ROW EXECUTE FUNCTION paygate.lineage_transition_guard();
CREATE TRIGGER lineage_max_ledger_guard BEFORE UPDATE ON paygate.lineages
    FOR EACH ROW EXECUTE FUNCTION paygate.lineage_max_ledger_guard();
CREATE TRIGGER lineage_no_delete BEFORE DELETE ON paygate.lineages
    FOR EACH ROW EXECUTE FUNCTION paygate.lineage_delete_guard();

-- == Funding (docs/architecture.md §5) ===========================================================

-- A user's signed SAC transfer authorisation -> USDC into the billing contract -> credit.
CREATE TABLE paygate.deposits (
    id                    bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    account               text NOT NULL REFERENCES paygate.accounts (address),
    amount                numeric(39,0) NOT NULL CHECK (amount > 0),
    auth_entry            text NOT NULL,   -- base64 SorobanAuthorizationEntry signed by the user
    auth_nonce            bigint NOT NULL,
    auth_expiration_ledger integer NOT NULL CHECK (auth_expiration_ledger > 0),
    idempotency_key       text NOT NULL,
    status                text NOT NULL DEFAULT 'pending'
                          CHECK (status IN ('pending', 'settled', 'expired', 'failed', 'needs_human')),
    attempts              integer NOT NULL DEFAULT 0,
    lease_token           uuid,
    lease_expires_at      timestamptz,
    claimed_by            text,
    deposit_lineage_id    bigint REFERENCES paygate.lineages (id),
    credit_lineage_id     bigint REFERENCES paygate.lineages (id),
    deposit_tx            bytea CHECK (length(deposit_tx) = 32),   -- inner hash of the applied deposit
    pending_failure       text,            -- a terminal reason waiting for its lineage to be proven dead
    reason                text,            -- why it ended failed / expired / needs_human
    settled_by            text CHECK (settled_by IN ('funding', 'observer')),
    settled_at            timestamptz,
    created_at            timestamptz NOT NULL DEFAULT now(),
    updated_at            timestamptz NOT NULL DEFAULT now(),
    UNIQUE (account, auth_nonce),
    CHECK ((status = 'settled') = (settled_at IS NOT NULL)),
    CHECK (status IN ('pending', 'settled') OR reason IS NOT NULL)
) WITH (fillfactor = 50);  -- room for HOT claims: see "HOT claims" at the end of this file
-- Status moves (docs/states.md): out of pending; failed, expired and needs_human back to pending
-- by replay only; settled never (queue_status_guard).
CREATE TRIGGER deposit_status_guard BEFORE UPDATE OF status ON paygate.deposits
    FOR EACH ROW WHEN (NEW.status IS DISTINCT FROM OLD.status)
    EXECUTE FUNCTION paygate.queue_status_guard('pending', 'settled');
CREATE INDEX deposits_claimable ON paygate.deposits (id) WHERE status = 'pending';
CREATE INDEX deposits_deposit_tx ON paygate.deposits (deposit_tx);
-- The needs_human queue depth (ops/status.py: count and oldest updated_at), indexed on id (never
-- written) rather than updated_at (written by every claim, release and renewal): the same partial
-- set, and those writes stay HOT.
CREATE INDEX deposits_needs_human ON paygate.deposits (id) WHERE status = 'needs_human';
-- Deleting a lineage makes Postgres check every foreign key that points at it. Without an index on
-- the referencing column that check is a sequential scan of the whole referencing table per
-- deleted lineage.
CREATE INDEX deposits_deposit_lineage ON paygate.deposits (deposit_lineage_id)
    WHERE deposit_lineage_id IS NOT NULL;
CREATE INDEX deposits_credit_lineage ON paygate.deposits (credit_lineage_id)
    WHERE credit_lineage_id IS NOT NULL;

-- == Subscriptions and charges (docs/architecture.md §5 Settlement and Observer) =================

-- One charge per period, through the same admission path as one-off charges. A period's start is
-- derived, never chosen: anchor + k * period for k = 0, 1, 2, …; the unique index
-- charges_subscription_period makes a second charge for a period impossible.
CREATE TABLE paygate.subscriptions (
    id                  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    account             text NOT NULL REFERENCES paygate.accounts (address),
    amount              numeric(39,0) NOT NULL CHECK (amount > 0),
    period              interval NOT NULL CHECK (period >= interval '1 minute'),
    anchor              timestamptz NOT NULL,
    description         text CHECK (length(description) <= 1000),
    status              text NOT NULL DEFAULT 'active'
                        CHECK (status IN ('active', 'past_due', 'paused', 'cancelled')),
    next_period_index   integer NOT NULL DEFAULT 0 CHECK (next_period_index >= 0),
    next_period_start   timestamptz NOT NULL,   -- = anchor + next_period_index * period (kept in step)
    retry_at            timestamptz,            -- past_due: when the unpaid period is tried again
    past_due_since      timestamptz,
    idempotency_key     text NOT NULL,
    cancelled_at        timestamptz,
    cancel_reason       text,
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    UNIQUE (idempotency_key),
    CHECK (next_period_start = anchor + next_period_index * period),
    CHECK ((status = 'past_due') = (past_due_since IS NOT NULL AND retry_at IS NOT NULL)),
    CHECK ((status = 'cancelled') = (cancelled_at IS NOT NULL))
);
CREATE INDEX subscriptions_due ON paygate.subscriptions (next_period_start) WHERE status = 'active';
CREATE INDEX subscriptions_retry ON paygate.subscriptions (retry_at) WHERE status = 'past_due';

-- One row per admitted charge. Lifecycle:
--   authorized (debited from the cached balance)
--     -> claimed by a settlement worker: claimed_at + lineage_id set in the claim transaction; the
--        lineage's state says how far the batch is (allocated / signed = journaled / sent / applied).
--        No status of its own: a third full-row update per charge costs more than it tells.
--     -> settled  (the observer saw `charge`)
--      | failed   (the observer saw `charge_failed`, or max_attempts lineages were each proven
--                  dead; the cached balance is restored in the same transaction)
--      | needs_human (its batch's envelope cannot be decrypted: still debited in the cached
--                  balance, held by its lineage, never claimable again, waiting for a human)
--   A batch whose lineage is proven dead (expired/superseded/failed on chain) hands its rows back
--   to authorized with lineage_id NULL and attempts + 1: only then can they be claimed again.
CREATE TABLE paygate.charges (
    id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- The contract's dedup key: consumable once on chain, so a resubmitted batch never debits twice.
    charge_id         bytea NOT NULL UNIQUE CHECK (length(charge_id) = 32),
    account           text NOT NULL REFERENCES paygate.accounts (address),
    amount            numeric(39,0) NOT NULL CHECK (amount > 0),
    idempotency_key   text NOT NULL,
    description       text CHECK (length(description) <= 1000),
    subscription_id   bigint CONSTRAINT charges_subscription_fk REFERENCES paygate.subscriptions (id),
    period_start      timestamptz,
    status            text NOT NULL DEFAULT 'authorized'
                      CONSTRAINT charges_status_check
                      CHECK (status IN ('authorized', 'settled', 'failed', 'needs_human')),
    claimed_at        timestamptz,
    claimed_by        text,
    lineage_id        bigint REFERENCES paygate.lineages (id),
    -- Lineages of this charge proven dead (each one counted in attempts).
    attempts          integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    dead_lineages     bigint[] NOT NULL DEFAULT '{}',
    reason            text,              -- why it failed / needs a human
    failed_by         text CHECK (failed_by IN ('observer', 'settlement')),
    event_id          text,              -- the chain event that settled/failed it
    settled_ledger    integer,
    settled_at        timestamptz,
    failed_at         timestamptz,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    CHECK ((subscription_id IS NULL) = (period_start IS NULL)),
    CHECK ((claimed_at IS NULL) = (lineage_id IS NULL) OR status IN ('settled', 'failed')),
    CHECK ((status = 'settled') = (settled_at IS NOT NULL)),
    CHECK ((status = 'failed') = (failed_at IS NOT NULL AND reason IS NOT NULL AND failed_by IS NOT NULL)),
    CONSTRAINT charges_needs_human_has_reason CHECK (status <> 'needs_human' OR reason IS NOT NULL)
-- Room on each page for the next version of its rows. A charge is rewritten twice (claimed, then
-- settled or failed), and neither can be HOT (each changes an indexed column), but where the page
-- has room the new version stays on it: no free-space-map search, no other heap page touched.
-- Measured (bench/growth.py, 10 k vs 5 M history rows): the claim's buffers grew 1.25x without
-- it, 1.20x with it; the observer's settle of a page touched 9% fewer. The price: the heap is ~40%
-- larger for the same rows (retention moves terminal charges out after its window, so bounded).
) WITH (fillfactor = 70);
-- Settlement's claim (workers/settlement.py CLAIM_SQL) locks the oldest claimable charges in
-- (created_at, id) order with FOR UPDATE SKIP LOCKED. Indexed in claim order, a claim reads its
-- batch and stops (with only created_at indexed, the planner sorted every claimable row before
-- locking the first batch: each claim's cost grew with the backlog). Has-work checks use it too.
CREATE INDEX charges_claim_order ON paygate.charges (created_at, id)
    WHERE status = 'authorized' AND claimed_at IS NULL AND lineage_id IS NULL;
CREATE INDEX charges_lineage ON paygate.charges (lineage_id) WHERE lineage_id IS NOT NULL;
CREATE INDEX charges_open ON paygate.charges (created_at) WHERE status = 'authorized';
-- The reconciler sums each checked account's admitted-but-unobserved charges: walk only those. (No
-- index on charges (account) otherwise: nothing reads all of an account's charges, accounts are
-- never deleted, and each claimed charge would pay for an entry.)
CREATE INDEX charges_open_account ON paygate.charges (account) WHERE status = 'authorized';
-- Only subscription charges can collide on a period (NULLs never do): a partial unique index, so a
-- one-off charge's claim does not pay for an entry in an index of every charge ever made.
CREATE UNIQUE INDEX charges_subscription_period ON paygate.charges (subscription_id, period_start)
    WHERE subscription_id IS NOT NULL;
CREATE INDEX charges_terminal_at ON paygate.charges ((coalesce(settled_at, failed_at)))
    WHERE status IN ('settled', 'failed');

-- One row per charge_batch lineage: who drives it (lease, DB time) and how it ended for the rows.
-- A batch is open until its lineage is terminal and its rows have been handed on ('needs_human':
-- its envelope cannot be decrypted; its lineage is swept to a terminal state by the chain).
CREATE TABLE paygate.charge_batches (
    lineage_id        bigint PRIMARY KEY REFERENCES paygate.lineages (id),
    entries           integer NOT NULL CHECK (entries BETWEEN 1 AND 100),
    lease_token       uuid,
    lease_expires_at  timestamptz,
    claimed_by        text,
    outcome           text CONSTRAINT charge_batches_outcome_check
                      CHECK (outcome IN ('applied', 'dead', 'abandoned', 'needs_human')),
    created_at        timestamptz NOT NULL DEFAULT now(),
    closed_at         timestamptz,
    CHECK ((outcome IS NULL) = (closed_at IS NULL))
);
CREATE INDEX charge_batches_open ON paygate.charge_batches (created_at) WHERE closed_at IS NULL;
CREATE INDEX charge_batches_closed ON paygate.charge_batches (closed_at) WHERE closed_at IS NOT NULL;

-- Every billing-contract event the observer applied or quarantined; the unique event id makes a
-- replayed page a no-op.
CREATE TABLE paygate.chain_events (
    id                 bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id           text NOT NULL UNIQUE,
    ledger             integer NOT NULL,
    tx_hash            text,
    contract_id        text,
    kind               text,              -- charge | charge_failed | credit | (undecodable: NULL)
    payload            jsonb NOT NULL,    -- decoded fields, or the raw topic/value when undecodable
    applied_to         text,              -- 'charge:<id>' / 'deposit:<id>'
    effect             text,              -- settled / failed / credited / already_settled ...
    quarantined        boolean NOT NULL DEFAULT false,
    quarantine_reason  text,
    observed_at        timestamptz NOT NULL DEFAULT now(),
    CHECK (quarantined = (quarantine_reason IS NOT NULL))
);
CREATE INDEX chain_events_quarantined ON paygate.chain_events (observed_at) WHERE quarantined;
CREATE INDEX chain_events_applied_at ON paygate.chain_events (observed_at) WHERE NOT quarantined;

-- The observer's position in the event stream: exactly one row, exactly one writer (the observer
-- holds its advisory lock, and every write is a CAS on the cursor it read). Forward only.
CREATE TABLE paygate.observer_cursor (
    singleton      boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    cursor         text NOT NULL CHECK (cursor ~ '^[0-9]{19}-[0-9]{10}$'),
    ledger         integer NOT NULL,       -- the ledger the cursor points into
    latest_ledger  integer,                -- the RPC's latest ledger at the last page (lag = latest - ledger)
    pages          bigint NOT NULL DEFAULT 0,
    events         bigint NOT NULL DEFAULT 0,
    updated_at     timestamptz NOT NULL DEFAULT now()
);
CREATE TRIGGER observer_cursor_forward BEFORE UPDATE ON paygate.observer_cursor
    FOR EACH ROW EXECUTE FUNCTION paygate.observer_cursor_forward();

-- == Safety nets (docs/architecture.md §6, §7) ===================================================

-- One table of facts a human must look at: the reconciler's unexplained drift, lane gaps and lane
-- fences, the recovery worker's stuck items, repeated rejections. `reconcile-report`, `status` and
-- alerts all read it. A finding is open until a later check matches (resolved_at); at most one
-- open finding per subject. A `lane_fence` (a lane whose sequence was consumed by a transaction
-- paygate never journaled, docs/architecture.md §4 rule 10) stays open until an operator resolves
-- it with accept_lane_fence.
CREATE TABLE paygate.findings (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind        text NOT NULL CONSTRAINT findings_kind_check
                CHECK (kind IN ('balance_drift', 'total_drift', 'lane_gap', 'stuck', 'lane_fence',
                                'repeated_rejection')),
    subject     text NOT NULL,                 -- account address, lane address, 'contract', 'webhook_outbox:42'
    summary     text NOT NULL,
    details     jsonb NOT NULL DEFAULT '{}'::jsonb,
    first_seen  timestamptz NOT NULL DEFAULT now(),
    last_seen   timestamptz NOT NULL DEFAULT now(),
    seen_count  integer NOT NULL DEFAULT 1 CHECK (seen_count > 0),
    alerted_at  timestamptz,                   -- set once, when the alert went out
    resolved_at  timestamptz,
    resolved_by  text,
    CHECK ((resolved_at IS NULL) = (resolved_by IS NULL))
);
CREATE UNIQUE INDEX findings_one_open ON paygate.findings (kind, subject) WHERE resolved_at IS NULL;
CREATE INDEX findings_first_seen ON paygate.findings (first_seen);
-- "Is this row named by an unresolved finding?" (retention): open findings are few, so it stays tiny.
CREATE INDEX findings_open_subject ON paygate.findings (subject) WHERE resolved_at IS NULL;

-- The reconciler's last look at each account (a side table: the hot accounts row is not widened,
-- and the pacing walks its own index, least recently checked first).
CREATE TABLE paygate.account_checks (
    address         text PRIMARY KEY REFERENCES paygate.accounts (address),
    checked_at      timestamptz NOT NULL DEFAULT now(),
    chain_ledger    integer,
    chain_balance   numeric(39,0) NOT NULL,
    cached_balance  numeric(39,0) NOT NULL,
    in_flight       numeric(39,0) NOT NULL DEFAULT 0,   -- admitted charges not yet observed
    lagging         numeric(39,0) NOT NULL DEFAULT 0,   -- explained by events past the observer's cursor
    regime          text NOT NULL CHECK (regime IN ('match', 'in_flight', 'lagging', 'unexplained')),
    drift           numeric(40,0) NOT NULL                 -- chain - cached
);
CREATE INDEX account_checks_checked_at ON paygate.account_checks (checked_at);
CREATE INDEX account_checks_regime ON paygate.account_checks (regime) WHERE regime <> 'match';

-- == Relays and bot jobs (docs/architecture.md §5 "Relay", §6) ===================================
-- Relayed user calls with the gateway paying the fees, permissionless bot jobs, fee reservations
-- against a budget, and the gas monitor's state. Relay and bot-job lineages use the journal's
-- purpose 'relay'; their entitlements are 'relay:<id>' and 'bot_job:<id>'.

-- Which contract functions the gateway will pay fees for. Configuration the operator fills (an
-- INSERT, audited like any operator write), never code: a function not listed here is refused at
-- admission, and the workers check again before they build (a row removed later is quarantined).
CREATE TABLE paygate.relay_allowlist (
    contract    text NOT NULL CHECK (contract ~ '^C[A-Z2-7]{55}$'),
    function    text NOT NULL CHECK (function ~ '^[A-Za-z0-9_]{1,32}$'),
    -- Optional per-function cap on the fee a relay may reserve (stroops); NULL: the global cap.
    max_fee     bigint CHECK (max_fee > 0),
    enabled     boolean NOT NULL DEFAULT true,
    note        text,
    added_by    text NOT NULL DEFAULT current_user,
    added_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (contract, function)
);

-- The relay path's knobs, in one row the operator may UPDATE. Amounts in stroops (1 XLM = 10^7).
-- In the database rather than in settings because admission (SQL, called by the API service) and
-- the gas monitor must read the same numbers.
CREATE TABLE paygate.relay_config (
    singleton           boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    -- Fees all open reservations together may hold; admission refuses a relay beyond it.
    fee_budget          bigint NOT NULL DEFAULT 1000000000 CHECK (fee_budget >= 0),
    -- Largest fee one relay may reserve.
    max_fee_per_relay   bigint NOT NULL DEFAULT 100000000 CHECK (max_fee_per_relay > 0),
    -- Gas monitor floors on the fee account's headroom (balance - reserve - reserved fees).
    gas_warning_floor   bigint NOT NULL DEFAULT 500000000,
    gas_critical_floor  bigint NOT NULL DEFAULT 100000000,
    -- The gas halt clears only above this (hysteresis: no flapping around the critical floor).
    gas_resume_floor    bigint NOT NULL DEFAULT 200000000,
    -- A lane whose spendable XLM falls below this is reported (it cannot pay its own reserve growth).
    lane_min_balance    bigint NOT NULL DEFAULT 50000000 CHECK (lane_min_balance >= 0),
    -- Bot jobs: proven-dead lineages before a job is 'dead' (replayable).
    bot_job_max_attempts integer NOT NULL DEFAULT 5 CHECK (bot_job_max_attempts > 0),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    CHECK (gas_critical_floor >= 0 AND gas_critical_floor <= gas_warning_floor
           AND gas_resume_floor > gas_critical_floor)
);
INSERT INTO paygate.relay_config DEFAULT VALUES;

-- The blind accumulator of relay fees: one row, incremented only by the statement that wins a
-- reservation's flip (admission: reserved += max_fee; disposition: reserved -= max_fee and
-- settled += fee charged, or released += max_fee). Its row lock also serialises the budget check.
CREATE TABLE paygate.relay_fee_totals (
    singleton  boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    reserved   bigint NOT NULL DEFAULT 0 CHECK (reserved >= 0),   -- open reservations, at their max
    settled    bigint NOT NULL DEFAULT 0 CHECK (settled >= 0),    -- fees charged on chain, exact
    released   bigint NOT NULL DEFAULT 0 CHECK (released >= 0),   -- reservations given back unused
    updated_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO paygate.relay_fee_totals DEFAULT VALUES;

-- One row per admitted relay. Lifecycle:
--   queued (reservation open) -- the relay worker claims it under a lease, journals one lineage
--     at a time (lineage_id points at the current one) and drives it;
--   -> applied | failed   (included on chain: the fee is settled from the receipt)
--   -> expired            (the authorisation can no longer succeed; reservation released)
--   -> rejected           (quarantined: bad authorisation, not allow-listed, ...; released)
--   -> needs_human        (nonce consumed with no lineage of ours; reservation stays open: a
--                          human decides, because a fee may have been burned by someone)
CREATE TABLE paygate.relays (
    id                      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    account                 text NOT NULL CHECK (account ~ '^[GC][A-Z2-7]{55}$'),
    contract                text NOT NULL CHECK (contract ~ '^C[A-Z2-7]{55}$'),
    function                text NOT NULL CHECK (function ~ '^[A-Za-z0-9_]{1,32}$'),
    args_xdr                text NOT NULL,          -- base64 SCVal (SCV_VEC) of the call's arguments
    auth_entries            text[] NOT NULL,        -- base64 SorobanAuthorizationEntry, user-signed
    auth_nonces             bigint[] NOT NULL,      -- per entry, read from the XDR at admission
    auth_expiration_ledger  integer NOT NULL CHECK (auth_expiration_ledger > 0),  -- min over entries
    max_fee                 bigint NOT NULL CHECK (max_fee > 0),
    idempotency_key         text NOT NULL,
    status                  text NOT NULL DEFAULT 'queued'
                            CHECK (status IN ('queued', 'applied', 'failed', 'expired', 'rejected',
                                              'needs_human')),
    attempts                integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    lease_token             uuid,
    lease_expires_at        timestamptz,
    claimed_by              text,
    lineage_id              bigint REFERENCES paygate.lineages (id),
    dead_lineages           bigint[] NOT NULL DEFAULT '{}',
    -- The network refused a lineage's bytes for good; the relay ends 'rejected' with this reason
    -- once that lineage is proven dead (never while it could still land).
    pending_failure         text,
    fee_charged             bigint,                 -- applied/failed: from the receipt
    -- The inner hash of the envelope installed for the current lineage (phase 2b: committed with the
    -- journaled envelope, under the lease); of the included transaction once applied/failed.
    tx_hash                 bytea CHECK (length(tx_hash) = 32),
    reason                  text,
    finished_at             timestamptz,
    created_at              timestamptz NOT NULL DEFAULT now(),
    updated_at              timestamptz NOT NULL DEFAULT now(),
    UNIQUE (idempotency_key),
    CHECK (cardinality(auth_entries) BETWEEN 1 AND 8 AND cardinality(auth_nonces) = cardinality(auth_entries)),
    CHECK ((status = 'queued') = (finished_at IS NULL)),
    CHECK (status NOT IN ('applied', 'failed') OR (fee_charged IS NOT NULL AND tx_hash IS NOT NULL)),
    CHECK (status IN ('queued', 'applied') OR reason IS NOT NULL)
) WITH (fillfactor = 50);  -- room for HOT claims: see "HOT claims" at the end of this file
-- Status moves (docs/states.md): out of queued; expired, rejected and needs_human back to queued by
-- replay only; applied and failed never (queue_status_guard).
CREATE TRIGGER relay_status_guard BEFORE UPDATE OF status ON paygate.relays
    FOR EACH ROW WHEN (NEW.status IS DISTINCT FROM OLD.status)
    EXECUTE FUNCTION paygate.queue_status_guard('queued', 'applied', 'failed');
CREATE INDEX relays_claimable ON paygate.relays (id) WHERE status = 'queued';
CREATE INDEX relays_expiry ON paygate.relays (auth_expiration_ledger) WHERE status = 'queued';
CREATE INDEX relays_lineage ON paygate.relays (lineage_id) WHERE lineage_id IS NOT NULL;
-- As deposits_needs_human: on id, so claims, releases and renewals stay HOT.
CREATE INDEX relays_needs_human ON paygate.relays (id) WHERE status = 'needs_human';

-- Fee reservations, opened by admission: reserved -> settled | released, exactly once (the CHECKs
-- and fee_reservation_guard make "both" and "twice" impossible, not merely unlikely). A replayed
-- relay (ops/replay.py) reserves its fee again, so a relay may hold several reservations over its
-- life: one per admission or replay (its `round`), at most one of them open. settle_relay_fee and
-- release_relay_fee close "the open one"; the closed rounds stay as history.
CREATE TABLE paygate.fee_reservations (
    relay_id     bigint REFERENCES paygate.relays (id),
    amount       bigint NOT NULL CHECK (amount > 0),    -- the reserved maximum
    status       text NOT NULL DEFAULT 'reserved' CHECK (status IN ('reserved', 'settled', 'released')),
    fee_charged  bigint CHECK (fee_charged >= 0),       -- settled: the receipt's feeCharged
    lineage_id   bigint REFERENCES paygate.lineages (id),  -- settled: whose receipt
    reason       text,
    created_at   timestamptz NOT NULL DEFAULT now(),
    closed_at    timestamptz,
    round        integer NOT NULL DEFAULT 1 CHECK (round > 0),
    CHECK ((status = 'reserved') = (closed_at IS NULL)),
    CHECK ((status = 'settled') = (fee_charged IS NOT NULL AND lineage_id IS NOT NULL)),
    PRIMARY KEY (relay_id, round)
);
CREATE INDEX fee_reservations_open ON paygate.fee_reservations (created_at) WHERE status = 'reserved';
CREATE UNIQUE INDEX fee_reservations_one_open ON paygate.fee_reservations (relay_id) WHERE status = 'reserved';
CREATE INDEX fee_reservations_lineage ON paygate.fee_reservations (lineage_id) WHERE lineage_id IS NOT NULL;
CREATE TRIGGER fee_reservation_guard BEFORE UPDATE ON paygate.fee_reservations
    FOR EACH ROW EXECUTE FUNCTION paygate.fee_reservation_guard();

-- Bot jobs: permissionless contract calls the product queues (e.g. market.close_expired). Each is
-- one lineage at a time from a lane with source-account auth only; dead after N proven-dead
-- lineages (replayable). No fee reservation: the gas monitor watches the account they spend from.
CREATE TABLE paygate.bot_jobs (
    id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_key           text NOT NULL UNIQUE CHECK (length(job_key) BETWEEN 1 AND 255),  -- the dedup key
    request_hash      bytea NOT NULL,
    contract          text NOT NULL CHECK (contract ~ '^C[A-Z2-7]{55}$'),
    function          text NOT NULL CHECK (function ~ '^[A-Za-z0-9_]{1,32}$'),
    args_xdr          text NOT NULL,
    status            text NOT NULL DEFAULT 'queued'
                      CHECK (status IN ('queued', 'applied', 'failed', 'dead', 'needs_human')),
    attempts          integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    max_attempts      integer CHECK (max_attempts > 0),   -- NULL: relay_config.bot_job_max_attempts
    lease_token       uuid,
    lease_expires_at  timestamptz,
    claimed_by        text,
    lineage_id        bigint REFERENCES paygate.lineages (id),
    dead_lineages     bigint[] NOT NULL DEFAULT '{}',
    pending_failure   text,
    fee_charged       bigint,
    tx_hash           bytea CHECK (length(tx_hash) = 32),
    reason            text,
    finished_at       timestamptz,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    CHECK ((status = 'queued') = (finished_at IS NULL)),
    CHECK (status IN ('queued', 'applied') OR reason IS NOT NULL)
) WITH (fillfactor = 50);  -- room for HOT claims: see "HOT claims" at the end of this file
-- Status moves (docs/states.md): out of queued; dead and needs_human back to queued by replay
-- only; applied and failed never (queue_status_guard).
CREATE TRIGGER bot_job_status_guard BEFORE UPDATE OF status ON paygate.bot_jobs
    FOR EACH ROW WHEN (NEW.status IS DISTINCT FROM OLD.status)
    EXECUTE FUNCTION paygate.queue_status_guard('queued', 'applied', 'failed');
CREATE INDEX bot_jobs_claimable ON paygate.bot_jobs (id) WHERE status = 'queued';
CREATE INDEX bot_jobs_dead ON paygate.bot_jobs (finished_at) WHERE status = 'dead';
CREATE INDEX bot_jobs_lineage ON paygate.bot_jobs (lineage_id) WHERE lineage_id IS NOT NULL;

-- Bot jobs have their own allow-list. A bot job is a call the gateway makes with no one's
-- signature (the workers refuse an envelope carrying any authorisation entry, chain/authority.py).
-- A function that is safe to relay with a user's signed authorisation is not therefore safe to
-- call with none, so admission and the drainer read this list, never relay_allowlist. Which
-- functions are permissionless is the operator's decision: it starts empty; a queued job whose
-- function is not listed fails at its next claim with the reason, and admission refuses it (42501).
CREATE TABLE paygate.bot_job_allowlist (
    contract    text NOT NULL CHECK (contract ~ '^C[A-Z2-7]{55}$'),
    function    text NOT NULL CHECK (function ~ '^[A-Za-z0-9_]{1,32}$'),
    enabled     boolean NOT NULL DEFAULT true,
    note        text,
    added_by    text NOT NULL DEFAULT current_user,
    added_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (contract, function)
);

-- The gas monitor's last reading (one row; status and alerts read it). The halt itself is the
-- durable paygate.halts row of kind 'gas'.
CREATE TABLE paygate.gas_state (
    singleton       boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    fee_account     text NOT NULL,
    balance         bigint NOT NULL,      -- stroops
    reserve         bigint NOT NULL,      -- the account's minimum balance (stroops)
    reserved_fees   bigint NOT NULL,      -- open relay reservations
    headroom        bigint NOT NULL,      -- balance - reserve - reserved_fees
    level           text NOT NULL CHECK (level IN ('ok', 'warning', 'critical')),
    halted          boolean NOT NULL,
    low_lanes       jsonb NOT NULL DEFAULT '[]'::jsonb,
    ledger          integer,
    checked_at      timestamptz NOT NULL DEFAULT now()
);

-- == Retention ===================================================================================
-- Terminal history leaves the hot tables. The retention worker (workers/retention.py) moves rows
-- terminal for longer than PAYGATE_RETENTION_WINDOW into paygate_archive and deletes them from the
-- hot table in the same statement, one bounded batch per transaction. What each table may lose,
-- and why that is safe, is written beside the worker's SQL. Its scans (the *_terminal_at,
-- *_closed, *_applied_at, *_delivered, *_started_at and lineages_retention indexes above) each walk
-- only terminal rows in the order they became terminal, so a batch costs the rows it moves.

CREATE SCHEMA IF NOT EXISTS paygate_archive;

-- Same columns as the hot table (no identity, defaults, checks or foreign keys: an archived row is
-- a record, not a queue item) + when it was archived. The primary key makes "archived twice"
-- impossible, so a row is in the hot table or in the archive, never both. A column added to a hot
-- table later is added to its archive table in the same migration (retention refuses to move rows
-- otherwise).
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

-- == HOT claims ==================================================================================
-- A claim (and a lease release or renewal) rewrites lease_token, lease_expires_at, claimed_by,
-- attempts and updated_at of rows it leaves in their status. PostgreSQL updates a row "heap only"
-- (HOT: the new version on the same page, NO new index entry) when no column it changes appears in
-- any index of the table (key, expression or partial-index predicate) and the page has room;
-- otherwise every index gets a new entry, and the deep ones cost more per claimed row as history
-- grows. The queue tables whose rows are claimed, renewed and released in place (deposits, relays,
-- bot_jobs) are therefore indexed on columns a claim never writes, and filled to 50%: a claim takes
-- every claimable row of a page at once and the old versions stay until it commits, so a page
-- needs room for a second copy of its rows (measured, tests/workers/test_hot_claims.py: at 80% a claim of
-- 16 fresh rows was HOT for 4, at 70% for 8, at 60% for 12, at 50% for all). The price: these
-- tables keep their history, so their heap takes about twice the space. Not set on tables whose
-- every update changes an indexed column anyway (webhook_outbox's claim, take-over and settle each
-- change status; subscriptions' claim is a row lock and its updates move next_period_start/retry_at).
