-- The relay path (docs/architecture.md §5 "Relay", §6): relayed user calls with the gateway paying the fees,
-- permissionless bot jobs, fee reservations against a budget, and the gas monitor's state.
-- Relay and bot-job lineages use the journal's existing purpose 'relay'; their entitlements are
-- 'relay:<id>' and 'bot_job:<id>' (the journal's one-live / one-applied indexes hold per entitlement).

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
);
CREATE INDEX relays_claimable ON paygate.relays (id) WHERE status = 'queued';
CREATE INDEX relays_expiry ON paygate.relays (auth_expiration_ledger) WHERE status = 'queued';
CREATE INDEX relays_lineage ON paygate.relays (lineage_id) WHERE lineage_id IS NOT NULL;

-- One reservation per relay, opened by admission. reserved -> settled | released, exactly once:
-- the CHECKs and the trigger make "both" and "twice" impossible, not merely unlikely.
CREATE TABLE paygate.fee_reservations (
    relay_id     bigint PRIMARY KEY REFERENCES paygate.relays (id),
    amount       bigint NOT NULL CHECK (amount > 0),    -- the reserved maximum
    status       text NOT NULL DEFAULT 'reserved' CHECK (status IN ('reserved', 'settled', 'released')),
    fee_charged  bigint CHECK (fee_charged >= 0),       -- settled: the receipt's feeCharged
    lineage_id   bigint REFERENCES paygate.lineages (id),  -- settled: whose receipt
    reason       text,
    created_at   timestamptz NOT NULL DEFAULT now(),
    closed_at    timestamptz,
    CHECK ((status = 'reserved') = (closed_at IS NULL)),
    CHECK ((status = 'settled') = (fee_charged IS NOT NULL AND lineage_id IS NOT NULL))
);
CREATE INDEX fee_reservations_open ON paygate.fee_reservations (created_at) WHERE status = 'reserved';

CREATE FUNCTION paygate.fee_reservation_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.status <> 'reserved' THEN
        RAISE EXCEPTION 'fee reservation of relay % is closed (%); it never changes', OLD.relay_id, OLD.status
            USING ERRCODE = 'check_violation';
    END IF;
    IF NEW.amount <> OLD.amount THEN
        RAISE EXCEPTION 'fee reservation of relay %: the reserved amount never changes', OLD.relay_id
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER fee_reservation_guard BEFORE UPDATE ON paygate.fee_reservations
    FOR EACH ROW EXECUTE FUNCTION paygate.fee_reservation_guard();

-- Closing a reservation and moving the accumulator are one statement each: whoever wins
-- reserved -> settled/released applies the totals; a loser's statement matches no row.
CREATE FUNCTION paygate.settle_relay_fee(p_relay_id bigint, p_lineage_id bigint, p_fee bigint)
RETURNS boolean LANGUAGE sql AS $$
    WITH flipped AS (
        UPDATE paygate.fee_reservations
        SET status = 'settled', fee_charged = p_fee, lineage_id = p_lineage_id, closed_at = now()
        WHERE relay_id = p_relay_id AND status = 'reserved'
        RETURNING amount
    ), totals AS (
        UPDATE paygate.relay_fee_totals t
        SET reserved = t.reserved - f.amount, settled = t.settled + p_fee, updated_at = now()
        FROM flipped f RETURNING 1
    )
    SELECT EXISTS (SELECT 1 FROM totals)
$$;

CREATE FUNCTION paygate.release_relay_fee(p_relay_id bigint, p_reason text)
RETURNS boolean LANGUAGE sql AS $$
    WITH flipped AS (
        UPDATE paygate.fee_reservations
        SET status = 'released', reason = p_reason, closed_at = now()
        WHERE relay_id = p_relay_id AND status = 'reserved'
        RETURNING amount
    ), totals AS (
        UPDATE paygate.relay_fee_totals t
        SET reserved = t.reserved - f.amount, released = t.released + f.amount, updated_at = now()
        FROM flipped f RETURNING 1
    )
    SELECT EXISTS (SELECT 1 FROM totals)
$$;

-- What SQL can prove about one SorobanAuthorizationEntry (base64 XDR) without an XDR library:
-- the credentials are ADDRESS (1) or ADDRESS_V2 (2) for an account or contract address, and the
-- nonce and signatureExpirationLedger that follow. Signature, network and invocation are checked
-- by the relay worker, which quarantines what this cannot see.
CREATE FUNCTION paygate.relay_auth_shape(p_entry text, OUT nonce bigint, OUT expiration_ledger bigint)
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v bytea;
    v_cred integer;
    v_addr integer;
    v_off integer;  -- 0-based offset of the nonce
BEGIN
    IF p_entry IS NULL OR length(p_entry) > 16384 OR p_entry !~ '^[A-Za-z0-9+/]+={0,2}$'
       OR length(p_entry) % 4 <> 0 THEN
        RAISE EXCEPTION 'auth entry is not base64 XDR' USING ERRCODE = '22023';
    END IF;
    v := decode(p_entry, 'base64');
    IF length(v) < 16 THEN
        RAISE EXCEPTION 'auth entry is too short to be a SorobanAuthorizationEntry' USING ERRCODE = '22023';
    END IF;
    v_cred := ('x' || encode(substring(v FROM 1 FOR 4), 'hex'))::bit(32)::integer;
    IF v_cred = 0 THEN
        RAISE EXCEPTION 'auth entry has SOURCE_ACCOUNT credentials: it would authorise as the gateway''s own '
            'account; a relay carries the user''s ADDRESS credentials' USING ERRCODE = '22023';
    ELSIF v_cred NOT IN (1, 2) THEN
        RAISE EXCEPTION 'auth entry credentials must be ADDRESS or ADDRESS_V2 (type %)', v_cred
            USING ERRCODE = '22023';
    END IF;
    v_addr := ('x' || encode(substring(v FROM 5 FOR 4), 'hex'))::bit(32)::integer;
    IF v_addr = 0 THEN
        v_off := 4 + 4 + 4 + 32;   -- credentials type, address type, key type, ed25519 key
    ELSIF v_addr = 1 THEN
        v_off := 4 + 4 + 32;       -- credentials type, address type, contract hash
    ELSE
        RAISE EXCEPTION 'auth entry credentials must name an account or a contract (address type %)', v_addr
            USING ERRCODE = '22023';
    END IF;
    IF length(v) < v_off + 12 + 4 THEN
        RAISE EXCEPTION 'auth entry is truncated' USING ERRCODE = '22023';
    END IF;
    nonce := ('x' || encode(substring(v FROM v_off + 1 FOR 8), 'hex'))::bit(64)::bigint;
    expiration_ledger := ('x' || '00000000' || encode(substring(v FROM v_off + 9 FOR 4), 'hex'))::bit(64)::bigint;
    IF expiration_ledger <= 0 THEN
        RAISE EXCEPTION 'auth entry has no signature expiration ledger' USING ERRCODE = '22023';
    END IF;
END
$$;

-- Admission of a relay, called by the API service. One transaction: idempotency record, the
-- relay, its fee reservation against the budget, the accumulator, the outbox event.
-- Refusals (nothing is recorded; SQLSTATEs as admit_charge): 22023 bad arguments or malformed
-- auth entries, 23505 idempotency key reused for a different request, 55000 admission halted
-- (operator or gas halt), 42501 contract function not allow-listed, PG402 fee budget exhausted.
CREATE FUNCTION paygate.admit_relay(
    p_account text, p_contract text, p_function text, p_args_xdr text, p_auth_entries text[],
    p_max_fee bigint, p_idempotency_key text, p_idempotency_ttl interval DEFAULT interval '24 hours'
) RETURNS TABLE (relay_id bigint, reserved_fee bigint, replayed boolean)
LANGUAGE plpgsql AS $$
DECLARE
    v_request_hash bytea := sha256(convert_to(concat_ws('|', p_account, p_contract, p_function, p_args_xdr,
                                                        array_to_string(p_auth_entries, ','), p_max_fee::text),
                                              'UTF8'));
    v_existing paygate.idempotency_keys%ROWTYPE;
    v_inserted boolean;
    v_config paygate.relay_config%ROWTYPE;
    v_allowed paygate.relay_allowlist%ROWTYPE;
    v_args bytea;
    v_entry text;
    v_shape record;
    v_nonces bigint[] := '{}';
    v_expiration bigint;
    v_reserved bigint;
    v_id bigint;
BEGIN
    IF p_idempotency_key IS NULL OR length(p_idempotency_key) NOT BETWEEN 1 AND 255 THEN
        RAISE EXCEPTION 'admit_relay: idempotency key must be 1..255 characters' USING ERRCODE = '22023';
    END IF;
    IF p_account IS NULL OR p_account !~ '^[GC][A-Z2-7]{55}$' THEN
        RAISE EXCEPTION 'admit_relay: account % is not a Stellar address', p_account USING ERRCODE = '22023';
    END IF;
    IF p_contract IS NULL OR p_contract !~ '^C[A-Z2-7]{55}$' THEN
        RAISE EXCEPTION 'admit_relay: contract % is not a contract address', p_contract USING ERRCODE = '22023';
    END IF;
    IF p_function IS NULL OR p_function !~ '^[A-Za-z0-9_]{1,32}$' THEN
        RAISE EXCEPTION 'admit_relay: function % is not a contract function name', p_function USING ERRCODE = '22023';
    END IF;
    IF p_args_xdr IS NULL OR length(p_args_xdr) > 65536 OR p_args_xdr !~ '^[A-Za-z0-9+/]+={0,2}$'
       OR length(p_args_xdr) % 4 <> 0 THEN
        RAISE EXCEPTION 'admit_relay: args_xdr is not base64 XDR' USING ERRCODE = '22023';
    END IF;
    v_args := decode(p_args_xdr, 'base64');
    -- SCVal { type = SCV_VEC (16), optional<SCVec> present (1) }: the argument list of the call.
    IF length(v_args) < 8 OR substring(v_args FROM 1 FOR 8) <> '\x0000001000000001'::bytea THEN
        RAISE EXCEPTION 'admit_relay: args_xdr must be an SCVal vector of the call''s arguments' USING ERRCODE = '22023';
    END IF;
    IF p_auth_entries IS NULL OR cardinality(p_auth_entries) NOT BETWEEN 1 AND 8 THEN
        RAISE EXCEPTION 'admit_relay: 1..8 auth entries are required' USING ERRCODE = '22023';
    END IF;
    FOREACH v_entry IN ARRAY p_auth_entries LOOP
        BEGIN
            v_shape := paygate.relay_auth_shape(v_entry);
        EXCEPTION WHEN invalid_parameter_value THEN
            RAISE EXCEPTION 'admit_relay: auth entry % of %: %', array_position(p_auth_entries, v_entry),
                cardinality(p_auth_entries), SQLERRM USING ERRCODE = '22023';
        END;
        v_nonces := v_nonces || v_shape.nonce;
        v_expiration := least(v_expiration, v_shape.expiration_ledger);
    END LOOP;
    IF v_expiration > 2147483647 THEN
        RAISE EXCEPTION 'admit_relay: auth expiration ledger out of range' USING ERRCODE = '22023';
    END IF;
    IF p_max_fee IS NULL OR p_max_fee <= 0 THEN
        RAISE EXCEPTION 'admit_relay: max_fee must be a positive number of stroops' USING ERRCODE = '22023';
    END IF;

    -- The key first, so two concurrent calls with one key serialise here (as admit_charge).
    INSERT INTO paygate.idempotency_keys (scope, key, request_hash, response, expires_at)
    VALUES ('relay', p_idempotency_key, v_request_hash, NULL, now() + p_idempotency_ttl)
    ON CONFLICT (scope, key) DO NOTHING
    RETURNING true INTO v_inserted;
    IF v_inserted IS NULL THEN
        SELECT * INTO v_existing FROM paygate.idempotency_keys WHERE scope = 'relay' AND key = p_idempotency_key;
        IF v_existing.request_hash <> v_request_hash THEN
            RAISE EXCEPTION 'admit_relay: idempotency key % was used for a different request', p_idempotency_key
                USING ERRCODE = '23505';
        END IF;
        RETURN QUERY SELECT (v_existing.response->>'relay_id')::bigint, (v_existing.response->>'reserved_fee')::bigint,
                            true;
        RETURN;
    END IF;

    IF EXISTS (SELECT 1 FROM paygate.halts) THEN
        RAISE EXCEPTION 'admit_relay: admission is halted (%)',
            (SELECT string_agg(kind || ': ' || reason, '; ' ORDER BY kind) FROM paygate.halts)
            USING ERRCODE = '55000';
    END IF;

    SELECT * INTO v_allowed FROM paygate.relay_allowlist WHERE contract = p_contract AND function = p_function
                                                            AND enabled;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'admit_relay: %.% is not on the relay allow-list', p_contract, p_function
            USING ERRCODE = '42501';
    END IF;
    SELECT * INTO v_config FROM paygate.relay_config;
    IF p_max_fee > least(v_config.max_fee_per_relay, coalesce(v_allowed.max_fee, v_config.max_fee_per_relay)) THEN
        RAISE EXCEPTION 'admit_relay: max_fee % is above the cap % for %', p_max_fee,
            least(v_config.max_fee_per_relay, coalesce(v_allowed.max_fee, v_config.max_fee_per_relay)), p_function
            USING ERRCODE = '22023';
    END IF;

    -- The reservation: the accumulator's row lock serialises concurrent admissions, so the budget
    -- check and the increment cannot interleave.
    UPDATE paygate.relay_fee_totals SET reserved = reserved + p_max_fee, updated_at = now()
    WHERE reserved + p_max_fee <= v_config.fee_budget
    RETURNING reserved INTO v_reserved;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'admit_relay: fee budget exhausted: % of % stroops reserved, this relay needs %',
            (SELECT reserved FROM paygate.relay_fee_totals), v_config.fee_budget, p_max_fee
            USING ERRCODE = 'PG402';
    END IF;

    INSERT INTO paygate.relays (account, contract, function, args_xdr, auth_entries, auth_nonces,
                                auth_expiration_ledger, max_fee, idempotency_key)
    VALUES (p_account, p_contract, p_function, p_args_xdr, p_auth_entries, v_nonces, v_expiration::integer,
            p_max_fee, p_idempotency_key)
    RETURNING id INTO v_id;
    INSERT INTO paygate.fee_reservations (relay_id, amount) VALUES (v_id, p_max_fee);
    UPDATE paygate.idempotency_keys
    SET response = jsonb_build_object('relay_id', v_id, 'reserved_fee', p_max_fee)
    WHERE scope = 'relay' AND key = p_idempotency_key;
    PERFORM paygate.emit_event('relay.queued', jsonb_build_object(
        'relay_id', v_id, 'account', p_account, 'contract', p_contract, 'function', p_function,
        'reserved_fee', p_max_fee, 'auth_expiration_ledger', v_expiration));
    RETURN QUERY SELECT v_id, p_max_fee, false;
END
$$;

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
);
CREATE INDEX bot_jobs_claimable ON paygate.bot_jobs (id) WHERE status = 'queued';
CREATE INDEX bot_jobs_dead ON paygate.bot_jobs (finished_at) WHERE status = 'dead';

-- Dedup per job key: the same key with the same call returns the first job; the same key with a
-- different call is refused (23505). Refused while admission is halted (55000) or when the
-- function is not allow-listed (42501), as for relays: a bot job spends the gateway's fees too.
CREATE FUNCTION paygate.admit_bot_job(
    p_job_key text, p_contract text, p_function text, p_args_xdr text, p_max_attempts integer DEFAULT NULL
) RETURNS TABLE (bot_job_id bigint, replayed boolean)
LANGUAGE plpgsql AS $$
DECLARE
    v_request_hash bytea := sha256(convert_to(concat_ws('|', p_contract, p_function, p_args_xdr), 'UTF8'));
    v_existing paygate.bot_jobs%ROWTYPE;
    v_args bytea;
    v_id bigint;
BEGIN
    IF p_job_key IS NULL OR length(p_job_key) NOT BETWEEN 1 AND 255 THEN
        RAISE EXCEPTION 'admit_bot_job: job key must be 1..255 characters' USING ERRCODE = '22023';
    END IF;
    IF p_contract IS NULL OR p_contract !~ '^C[A-Z2-7]{55}$' THEN
        RAISE EXCEPTION 'admit_bot_job: contract % is not a contract address', p_contract USING ERRCODE = '22023';
    END IF;
    IF p_function IS NULL OR p_function !~ '^[A-Za-z0-9_]{1,32}$' THEN
        RAISE EXCEPTION 'admit_bot_job: function % is not a contract function name', p_function
            USING ERRCODE = '22023';
    END IF;
    IF p_args_xdr IS NULL OR length(p_args_xdr) > 65536 OR p_args_xdr !~ '^[A-Za-z0-9+/]+={0,2}$'
       OR length(p_args_xdr) % 4 <> 0 THEN
        RAISE EXCEPTION 'admit_bot_job: args_xdr is not base64 XDR' USING ERRCODE = '22023';
    END IF;
    v_args := decode(p_args_xdr, 'base64');
    IF length(v_args) < 8 OR substring(v_args FROM 1 FOR 8) <> '\x0000001000000001'::bytea THEN
        RAISE EXCEPTION 'admit_bot_job: args_xdr must be an SCVal vector of the call''s arguments'
            USING ERRCODE = '22023';
    END IF;
    IF p_max_attempts IS NOT NULL AND p_max_attempts <= 0 THEN
        RAISE EXCEPTION 'admit_bot_job: max_attempts must be positive' USING ERRCODE = '22023';
    END IF;

    INSERT INTO paygate.bot_jobs (job_key, request_hash, contract, function, args_xdr, max_attempts)
    SELECT p_job_key, v_request_hash, p_contract, p_function, p_args_xdr, p_max_attempts
    WHERE NOT EXISTS (SELECT 1 FROM paygate.halts)
      AND EXISTS (SELECT 1 FROM paygate.relay_allowlist a
                  WHERE a.contract = p_contract AND a.function = p_function AND a.enabled)
    ON CONFLICT (job_key) DO NOTHING
    RETURNING id INTO v_id;
    IF v_id IS NOT NULL THEN
        RETURN QUERY SELECT v_id, false;
        RETURN;
    END IF;
    SELECT * INTO v_existing FROM paygate.bot_jobs WHERE job_key = p_job_key;
    IF FOUND THEN
        IF v_existing.request_hash <> v_request_hash THEN
            RAISE EXCEPTION 'admit_bot_job: job key % was used for a different call', p_job_key
                USING ERRCODE = '23505';
        END IF;
        RETURN QUERY SELECT v_existing.id, true;
        RETURN;
    END IF;
    IF EXISTS (SELECT 1 FROM paygate.halts) THEN
        RAISE EXCEPTION 'admit_bot_job: admission is halted (%)',
            (SELECT string_agg(kind || ': ' || reason, '; ' ORDER BY kind) FROM paygate.halts)
            USING ERRCODE = '55000';
    END IF;
    RAISE EXCEPTION 'admit_bot_job: %.% is not on the relay allow-list', p_contract, p_function
        USING ERRCODE = '42501';
END
$$;

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
