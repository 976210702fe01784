-- The transaction journal (lanes, lineages), domain events, and the funding queue (docs/architecture.md §4, §5).

-- Lanes: Stellar accounts that supply sequence numbers; one transaction in flight each.
CREATE TABLE paygate.lanes (
    address     text PRIMARY KEY CHECK (address ~ '^G[A-Z2-7]{55}$'),
    status      text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'drained', 'retired')),
    drained_at  timestamptz,
    drained_by  text,
    created_at  timestamptz NOT NULL DEFAULT now(),
    CHECK ((status = 'active') = (drained_at IS NULL))
);

-- One lineage = one transaction attempt. States (docs/architecture.md §4):
--   allocated -> signed -> sent -> applied | failed | expired | superseded
--   allocated -> abandoned (never signed: the lane is simply released)
--   signed    -> applied | failed | expired | superseded (resolved before any send was recorded)
CREATE TABLE paygate.lineages (
    id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    purpose           text NOT NULL CHECK (purpose IN ('deposit', 'credit', 'charge_batch', 'relay')),
    -- What this transaction pays for, e.g. 'deposit:42:deposit'. At most one live lineage
    -- and at most one applied lineage per entitlement (indexes below).
    entitlement       text NOT NULL,
    lane              text NOT NULL REFERENCES paygate.lanes (address),
    state             text NOT NULL DEFAULT 'allocated'
                      CHECK (state IN ('allocated', 'signed', 'sent', 'applied', 'failed', 'expired',
                                       'superseded', 'abandoned')),
    source_seq        bigint CHECK (source_seq > 0),
    key_id            text,
    envelope          bytea,            -- AES-GCM nonce || ciphertext of the fee-bump envelope XDR
    inner_hash        bytea CHECK (length(inner_hash) = 32),
    outer_hash        bytea CHECK (length(outer_hash) = 32),
    max_time          bigint,           -- the inner transaction's maxTime (ledger close time, unix s)
    signed_at_ledger  integer,          -- latest ledger when signed: a NOT_FOUND must cover it
    send_count        integer NOT NULL DEFAULT 0,
    last_send_status  text,
    ledger            integer,          -- where it was included (applied/failed)
    fee_charged       bigint,
    result_code       text,
    resolution        text,             -- how a terminal state was proven
    created_at        timestamptz NOT NULL DEFAULT now(),
    signed_at         timestamptz,
    sent_at           timestamptz,
    resolved_at       timestamptz,
    CHECK (state IN ('allocated', 'abandoned') OR (source_seq IS NOT NULL AND key_id IS NOT NULL
           AND envelope IS NOT NULL AND inner_hash IS NOT NULL AND outer_hash IS NOT NULL
           AND max_time IS NOT NULL AND signed_at_ledger IS NOT NULL)),
    CHECK (state NOT IN ('applied', 'failed') OR ledger IS NOT NULL)
);
-- Stellar queues one transaction per source account: at most one live lineage per lane.
CREATE UNIQUE INDEX lineages_one_live_per_lane ON paygate.lineages (lane)
    WHERE state IN ('allocated', 'signed', 'sent');
CREATE UNIQUE INDEX lineages_one_live_per_entitlement ON paygate.lineages (entitlement)
    WHERE state IN ('allocated', 'signed', 'sent');
CREATE UNIQUE INDEX lineages_one_applied_per_entitlement ON paygate.lineages (entitlement)
    WHERE state = 'applied';
CREATE INDEX lineages_entitlement ON paygate.lineages (entitlement);
CREATE INDEX lineages_lane_seq ON paygate.lineages (lane, source_seq);
CREATE UNIQUE INDEX lineages_inner_hash ON paygate.lineages (inner_hash);
CREATE INDEX lineages_key_id ON paygate.lineages (key_id);

-- Terminal rows never change, and only the transitions above are possible: enforced here too, so
-- a bug or a hand-written UPDATE cannot rewrite history.
CREATE FUNCTION paygate.lineage_transition_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.state IN ('applied', 'failed', 'expired', 'superseded', 'abandoned') THEN
        RAISE EXCEPTION 'lineage % is terminal (%); it never changes', OLD.id, OLD.state
            USING ERRCODE = 'check_violation';
    END IF;
    IF NEW.state <> OLD.state AND NOT (
           (OLD.state = 'allocated' AND NEW.state IN ('signed', 'abandoned'))
        OR (OLD.state = 'signed' AND NEW.state IN ('sent', 'applied', 'failed', 'expired', 'superseded'))
        OR (OLD.state = 'sent' AND NEW.state IN ('applied', 'failed', 'expired', 'superseded'))) THEN
        RAISE EXCEPTION 'lineage %: % -> % is not a transition', OLD.id, OLD.state, NEW.state
            USING ERRCODE = 'check_violation';
    END IF;
    IF OLD.state <> 'allocated' AND (NEW.envelope IS DISTINCT FROM OLD.envelope
        OR NEW.inner_hash IS DISTINCT FROM OLD.inner_hash OR NEW.source_seq IS DISTINCT FROM OLD.source_seq
        OR NEW.lane IS DISTINCT FROM OLD.lane OR NEW.max_time IS DISTINCT FROM OLD.max_time) THEN
        RAISE EXCEPTION 'lineage %: a signed envelope is never replaced', OLD.id USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER lineage_transition_guard BEFORE UPDATE ON paygate.lineages
    FOR EACH ROW EXECUTE FUNCTION paygate.lineage_transition_guard();
CREATE FUNCTION paygate.refuse_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'rows of % are never deleted (the journal is the evidence)', TG_TABLE_NAME
        USING ERRCODE = 'insufficient_privilege';
END
$$;
CREATE TRIGGER lineage_no_delete BEFORE DELETE ON paygate.lineages
    FOR EACH ROW EXECUTE FUNCTION paygate.refuse_delete();

-- Domain events: written in the same transaction as the state change they announce, fanned out
-- to every enabled webhook endpoint.
CREATE FUNCTION paygate.emit_event(p_type text, p_payload jsonb) RETURNS integer
LANGUAGE sql AS $$
    WITH inserted AS (
        INSERT INTO paygate.webhook_outbox (endpoint_id, event_type, payload)
        SELECT e.id, p_type, p_payload FROM paygate.webhook_endpoints e WHERE e.enabled
        RETURNING 1
    )
    SELECT count(*)::integer FROM inserted
$$;

-- Funding: a user's signed SAC transfer authorisation -> USDC into the billing contract -> credit.
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
);
CREATE INDEX deposits_claimable ON paygate.deposits (id) WHERE status = 'pending';
CREATE INDEX deposits_deposit_tx ON paygate.deposits (deposit_tx);

-- Admission, called by the API service: shape checks, idempotency, insert, all in one transaction.
-- The deep checks (XDR decoding, signature, contract, amount, destination) run in the funding
-- worker, which quarantines a bad authorisation with its reason instead of retrying it.
CREATE FUNCTION paygate.admit_deposit(
    p_account text, p_amount numeric, p_auth_entry text, p_auth_nonce bigint,
    p_auth_expiration_ledger integer, p_idempotency_key text,
    p_idempotency_ttl interval DEFAULT interval '24 hours'
) RETURNS TABLE (deposit_id bigint, replayed boolean)
LANGUAGE plpgsql AS $$
DECLARE
    v_request_hash bytea := sha256(convert_to(concat_ws('|', p_account, p_amount::text, p_auth_entry,
                                                        p_auth_nonce::text, p_auth_expiration_ledger::text), 'UTF8'));
    v_existing paygate.idempotency_keys%ROWTYPE;
    v_id bigint;
BEGIN
    IF p_idempotency_key IS NULL OR length(p_idempotency_key) NOT BETWEEN 1 AND 255 THEN
        RAISE EXCEPTION 'admit_deposit: idempotency key must be 1..255 characters' USING ERRCODE = '22023';
    END IF;
    IF p_account IS NULL OR p_account !~ '^G[A-Z2-7]{55}$' THEN
        RAISE EXCEPTION 'admit_deposit: account % is not a Stellar account address', p_account USING ERRCODE = '22023';
    END IF;
    IF p_amount IS NULL OR p_amount <= 0 OR p_amount <> trunc(p_amount) OR p_amount >= 2::numeric ^ 127 THEN
        RAISE EXCEPTION 'admit_deposit: amount must be a positive integer below 2^127' USING ERRCODE = '22023';
    END IF;
    IF p_auth_entry IS NULL OR length(p_auth_entry) > 16384 OR p_auth_entry !~ '^[A-Za-z0-9+/]+={0,2}$'
       OR length(p_auth_entry) % 4 <> 0 THEN
        RAISE EXCEPTION 'admit_deposit: auth_entry is not base64 XDR' USING ERRCODE = '22023';
    END IF;
    IF p_auth_expiration_ledger IS NULL OR p_auth_expiration_ledger <= 0 THEN
        RAISE EXCEPTION 'admit_deposit: auth expiration ledger must be positive' USING ERRCODE = '22023';
    END IF;
    IF EXISTS (SELECT 1 FROM paygate.halts) THEN
        RAISE EXCEPTION 'admit_deposit: admission is halted (%)',
            (SELECT string_agg(kind || ': ' || reason, '; ') FROM paygate.halts) USING ERRCODE = '55000';
    END IF;

    SELECT * INTO v_existing FROM paygate.idempotency_keys
    WHERE scope = 'deposit' AND key = p_idempotency_key FOR UPDATE;
    IF FOUND THEN
        IF v_existing.request_hash <> v_request_hash THEN
            RAISE EXCEPTION 'admit_deposit: idempotency key % was used for a different request', p_idempotency_key
                USING ERRCODE = '23505';
        END IF;
        RETURN QUERY SELECT (v_existing.response->>'deposit_id')::bigint, true;
        RETURN;
    END IF;

    INSERT INTO paygate.accounts (address) VALUES (p_account) ON CONFLICT (address) DO NOTHING;
    INSERT INTO paygate.deposits (account, amount, auth_entry, auth_nonce, auth_expiration_ledger,
                                         idempotency_key)
    VALUES (p_account, p_amount, p_auth_entry, p_auth_nonce, p_auth_expiration_ledger, p_idempotency_key)
    RETURNING id INTO v_id;
    INSERT INTO paygate.idempotency_keys (scope, key, request_hash, response, expires_at)
    VALUES ('deposit', p_idempotency_key, v_request_hash, jsonb_build_object('deposit_id', v_id),
            now() + p_idempotency_ttl);
    RETURN QUERY SELECT v_id, false;
END
$$;
