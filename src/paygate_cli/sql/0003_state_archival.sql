-- State archival (docs/architecture.md §4 "State archival (TTL)", §6 "TTL keeper"): what paygate keeps
-- alive and when it expires, the extend/restore work that keeps it so, and the rent it spends per day.

-- Two more kinds of transaction in the journal: the keeper's ExtendFootprintTTL and a RestoreFootprint
-- (the keeper's, or one a money path asked for when simulation answered with a restorePreamble).
ALTER TABLE paygate.lineages DROP CONSTRAINT lineages_purpose_check,
    ADD CONSTRAINT lineages_purpose_check
        CHECK (purpose IN ('deposit', 'credit', 'charge_batch', 'relay', 'ttl_extend', 'restore'));

-- What paygate keeps alive, as the keeper last read it (getLedgerEntries' liveUntilLedgerSeq).
CREATE TABLE paygate.ttl_entries (
    key_hash     bytea PRIMARY KEY CHECK (length(key_hash) = 32),  -- sha256 of the LedgerKey XDR
    key_xdr      text NOT NULL,                                     -- base64 LedgerKey
    -- instance / code: the billing contract's; sac_balance: the billing contract's USDC balance in the
    -- SAC; account_balance: one account's balance entry in the billing contract
    kind         text NOT NULL CHECK (kind IN ('instance', 'code', 'sac_balance', 'account_balance')),
    account      text,
    -- unread: never read; live: read, not archived; archived: read archived (a restore is due);
    -- absent: no such entry (an account whose balance entry was never written); needs_human: a restore
    -- that could not bring it back (the key is the evidence)
    state        text NOT NULL DEFAULT 'unread'
                 CHECK (state IN ('unread', 'live', 'archived', 'absent', 'needs_human')),
    live_until   integer CHECK (live_until > 0),  -- the last ledger it is live in, as last read
    read_ledger  integer,                          -- the answer's latestLedger
    read_at      timestamptz,
    restored_at  timestamptz,
    reason       text,
    updated_at   timestamptz NOT NULL DEFAULT now(),
    CHECK ((kind = 'account_balance') = (account IS NOT NULL)),
    CHECK (state = 'unread' OR read_at IS NOT NULL),
    CHECK (state <> 'needs_human' OR reason IS NOT NULL)
);
-- The keeper's rotation (least recently read first) and the nearest expiry (status, metrics).
CREATE INDEX ttl_entries_rotation ON paygate.ttl_entries (read_at NULLS FIRST);
CREATE INDEX ttl_entries_expiry ON paygate.ttl_entries (live_until) WHERE state IN ('live', 'archived');

-- Extend / restore work: one transaction each, through the engine (journal first), like every money path.
CREATE TABLE paygate.ttl_jobs (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind             text NOT NULL CHECK (kind IN ('extend', 'restore')),
    key_hashes       bytea[] NOT NULL CHECK (cardinality(key_hashes) > 0),
    keys_xdr         text[] NOT NULL CHECK (cardinality(keys_xdr) = cardinality(key_hashes)),
    extend_to        integer CHECK (extend_to > 0),  -- extend: ledgers ahead of the latest
    requested_by     text NOT NULL,                  -- 'ttl', or the path that met a restorePreamble
    status           text NOT NULL DEFAULT 'pending'
                     CHECK (status IN ('pending', 'applied', 'failed', 'needs_human')),
    lineage_id       bigint REFERENCES paygate.lineages (id),
    lease_token      uuid,
    lease_expires_at timestamptz,
    claimed_at       timestamptz,
    attempts         smallint NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    rent_estimate    bigint CHECK (rent_estimate >= 0),  -- the simulation's resource fee when prepared
    fee_charged      bigint CHECK (fee_charged >= 0),    -- the receipt's feeCharged
    reason           text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    finished_at      timestamptz,
    CHECK ((kind = 'extend') = (extend_to IS NOT NULL)),
    CHECK ((status = 'pending') = (finished_at IS NULL))
);
CREATE INDEX ttl_jobs_pending ON paygate.ttl_jobs (created_at) WHERE status = 'pending';
CREATE INDEX ttl_jobs_lineage ON paygate.ttl_jobs (lineage_id) WHERE lineage_id IS NOT NULL;
-- A key has at most one open restore: a second path meeting the same archived entry joins the first.
CREATE INDEX ttl_jobs_open_keys ON paygate.ttl_jobs USING gin (key_hashes) WHERE status = 'pending';

-- Rent spent per UTC day (the keeper's budget, PAYGATE_TTL_RENT_BUDGET): fee_charged of ttl lineages.
CREATE TABLE paygate.ttl_rent (
    day           date PRIMARY KEY,
    spent         bigint NOT NULL DEFAULT 0 CHECK (spent >= 0),
    transactions  integer NOT NULL DEFAULT 0 CHECK (transactions >= 0),
    left_unextended integer NOT NULL DEFAULT 0 CHECK (left_unextended >= 0),  -- due entries left over budget
    updated_at    timestamptz NOT NULL DEFAULT now()
);
