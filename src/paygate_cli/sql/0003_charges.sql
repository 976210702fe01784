-- Charges (admission -> charge_batch -> settled/failed), the billing contract's events and the
-- observer's cursor (docs/architecture.md §5 Settlement and Observer, §8).

-- One row per admitted charge. Lifecycle:
--   authorized (debited from the cached balance)
--     -> claimed by a settlement worker: claimed_at + lineage_id set in the claim transaction; the
--        lineage's state says how far the batch is (allocated / signed = journaled / sent / applied).
--        No status of its own: a third full-row update per charge costs more than it tells.
--     -> settled  (the observer saw `charge`)
--      | failed   (the observer saw `charge_failed`, or max_attempts lineages were each proven
--                  dead; the cached balance is restored in the same transaction)
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
    -- Subscription periods (the subscriptions table arrives in a later migration; no FK yet).
    subscription_id   bigint,
    period_start      timestamptz,
    status            text NOT NULL DEFAULT 'authorized'
                      CHECK (status IN ('authorized', 'settled', 'failed')),
    claimed_at        timestamptz,
    claimed_by        text,
    lineage_id        bigint REFERENCES paygate.lineages (id),
    -- Lineages of this charge proven dead (each one counted in attempts).
    attempts          integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    dead_lineages     bigint[] NOT NULL DEFAULT '{}',
    reason            text,              -- why it failed
    failed_by         text CHECK (failed_by IN ('observer', 'settlement')),
    event_id          text,              -- the chain event that settled/failed it
    settled_ledger    integer,
    settled_at        timestamptz,
    failed_at         timestamptz,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    UNIQUE (subscription_id, period_start),
    CHECK ((subscription_id IS NULL) = (period_start IS NULL)),
    CHECK ((claimed_at IS NULL) = (lineage_id IS NULL) OR status IN ('settled', 'failed')),
    CHECK ((status = 'settled') = (settled_at IS NOT NULL)),
    CHECK ((status = 'failed') = (failed_at IS NOT NULL AND reason IS NOT NULL AND failed_by IS NOT NULL))
);
-- The claim walks this index in created_at order, only over rows nobody holds.
CREATE INDEX charges_claimable ON paygate.charges (created_at)
    WHERE status = 'authorized' AND claimed_at IS NULL AND lineage_id IS NULL;
CREATE INDEX charges_lineage ON paygate.charges (lineage_id) WHERE lineage_id IS NOT NULL;
CREATE INDEX charges_open ON paygate.charges (created_at) WHERE status = 'authorized';
CREATE INDEX charges_account ON paygate.charges (account);

-- One row per charge_batch lineage: who drives it (lease, DB time) and how it ended for the rows.
-- A batch is open until its lineage is terminal and its rows have been handed on.
CREATE TABLE paygate.charge_batches (
    lineage_id        bigint PRIMARY KEY REFERENCES paygate.lineages (id),
    entries           integer NOT NULL CHECK (entries BETWEEN 1 AND 100),
    lease_token       uuid,
    lease_expires_at  timestamptz,
    claimed_by        text,
    outcome           text CHECK (outcome IN ('applied', 'dead', 'abandoned')),
    created_at        timestamptz NOT NULL DEFAULT now(),
    closed_at         timestamptz,
    CHECK ((outcome IS NULL) = (closed_at IS NULL))
);
CREATE INDEX charge_batches_open ON paygate.charge_batches (created_at) WHERE closed_at IS NULL;

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

-- The observer's position in the event stream: exactly one row, exactly one writer (the observer
-- holds its advisory lock, and every write is a CAS on the cursor it read).
CREATE TABLE paygate.observer_cursor (
    singleton      boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    cursor         text NOT NULL CHECK (cursor ~ '^[0-9]{19}-[0-9]{10}$'),
    ledger         integer NOT NULL,       -- the ledger the cursor points into
    latest_ledger  integer,                -- the RPC's latest ledger at the last page (lag = latest - ledger)
    pages          bigint NOT NULL DEFAULT 0,
    events         bigint NOT NULL DEFAULT 0,
    updated_at     timestamptz NOT NULL DEFAULT now()
);
-- The cursor only moves forward: the zero-padded id orders lexicographically like (ledger, index).
CREATE FUNCTION paygate.observer_cursor_forward() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.cursor < OLD.cursor THEN
        RAISE EXCEPTION 'observer cursor may not move backwards (% -> %)', OLD.cursor, NEW.cursor
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER observer_cursor_forward BEFORE UPDATE ON paygate.observer_cursor
    FOR EACH ROW EXECUTE FUNCTION paygate.observer_cursor_forward();

-- Admission, called by the API service. One transaction: idempotency record, debit of the cached
-- balance, the charge with a fresh random 32-byte charge id, the outbox event.
-- Refusals (the transaction rolls back, nothing is recorded, a retry with the same key may succeed
-- later): SQLSTATE 22023 bad arguments, 23505 idempotency key reused for a different request,
-- 55000 admission halted (operator or gas halt), PG402 insufficient cached balance.
CREATE FUNCTION paygate.admit_charge(
    p_account text, p_amount numeric, p_idempotency_key text,
    p_description text DEFAULT NULL, p_subscription_id bigint DEFAULT NULL,
    p_period_start timestamptz DEFAULT NULL, p_idempotency_ttl interval DEFAULT interval '24 hours'
) RETURNS TABLE (charge_row_id bigint, charge_id bytea, balance numeric, replayed boolean)
LANGUAGE plpgsql AS $$
DECLARE
    v_request_hash bytea := sha256(convert_to(concat_ws('|', p_account, p_amount::text, coalesce(p_description, ''),
                                                        coalesce(p_subscription_id::text, ''),
                                                        coalesce(p_period_start::text, '')), 'UTF8'));
    v_existing paygate.idempotency_keys%ROWTYPE;
    v_inserted boolean;
    v_balance numeric;
    v_id bigint;
    v_charge_id bytea;
BEGIN
    IF p_idempotency_key IS NULL OR length(p_idempotency_key) NOT BETWEEN 1 AND 255 THEN
        RAISE EXCEPTION 'admit_charge: idempotency key must be 1..255 characters' USING ERRCODE = '22023';
    END IF;
    IF p_account IS NULL OR p_account !~ '^[GC][A-Z2-7]{55}$' THEN
        RAISE EXCEPTION 'admit_charge: account % is not a Stellar address', p_account USING ERRCODE = '22023';
    END IF;
    IF p_amount IS NULL OR p_amount <= 0 OR p_amount <> trunc(p_amount) OR p_amount >= 2::numeric ^ 127 THEN
        RAISE EXCEPTION 'admit_charge: amount must be a positive integer below 2^127' USING ERRCODE = '22023';
    END IF;
    IF (p_subscription_id IS NULL) <> (p_period_start IS NULL) THEN
        RAISE EXCEPTION 'admit_charge: subscription_id and period_start go together' USING ERRCODE = '22023';
    END IF;

    -- The key first, so two concurrent calls with one key serialise here: the second waits for the
    -- first to commit and then replays its result (or proceeds if the first rolled back).
    INSERT INTO paygate.idempotency_keys (scope, key, request_hash, response, expires_at)
    VALUES ('charge', p_idempotency_key, v_request_hash, NULL, now() + p_idempotency_ttl)
    ON CONFLICT (scope, key) DO NOTHING
    RETURNING true INTO v_inserted;
    IF v_inserted IS NULL THEN
        SELECT * INTO v_existing FROM paygate.idempotency_keys WHERE scope = 'charge' AND key = p_idempotency_key;
        IF v_existing.request_hash <> v_request_hash THEN
            RAISE EXCEPTION 'admit_charge: idempotency key % was used for a different request', p_idempotency_key
                USING ERRCODE = '23505';
        END IF;
        RETURN QUERY SELECT (v_existing.response->>'charge_row_id')::bigint,
                            decode(v_existing.response->>'charge_id', 'hex'),
                            (v_existing.response->>'balance')::numeric, true;
        RETURN;
    END IF;

    IF EXISTS (SELECT 1 FROM paygate.halts) THEN
        RAISE EXCEPTION 'admit_charge: admission is halted (%)',
            (SELECT string_agg(kind || ': ' || reason, '; ' ORDER BY kind) FROM paygate.halts)
            USING ERRCODE = '55000';
    END IF;

    UPDATE paygate.accounts SET cached_balance = cached_balance - p_amount, updated_at = now()
    WHERE address = p_account AND cached_balance >= p_amount
    RETURNING cached_balance INTO v_balance;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'admit_charge: insufficient balance: account % has %, the charge needs %', p_account,
            coalesce((SELECT cached_balance FROM paygate.accounts WHERE address = p_account), 0), p_amount
            USING ERRCODE = 'PG402';
    END IF;

    -- 32 bytes from two random UUIDs (244 random bits): unguessable and collision-free in practice;
    -- the UNIQUE constraint makes a collision an error, never a shared id.
    v_charge_id := uuid_send(gen_random_uuid()) || uuid_send(gen_random_uuid());
    INSERT INTO paygate.charges (charge_id, account, amount, idempotency_key, description, subscription_id,
                                 period_start)
    VALUES (v_charge_id, p_account, p_amount, p_idempotency_key, p_description, p_subscription_id, p_period_start)
    RETURNING id INTO v_id;
    UPDATE paygate.idempotency_keys
    SET response = jsonb_build_object('charge_row_id', v_id, 'charge_id', encode(v_charge_id, 'hex'),
                                      'balance', v_balance::text)
    WHERE scope = 'charge' AND key = p_idempotency_key;
    PERFORM paygate.emit_event('charge.authorized', jsonb_build_object(
        'charge_row_id', v_id, 'charge_id', encode(v_charge_id, 'hex'), 'account', p_account,
        'amount', p_amount::text, 'balance', v_balance::text));
    RETURN QUERY SELECT v_id, v_charge_id, v_balance, false;
END
$$;
