-- Admission of a charge, called by the API service. One transaction: idempotency record, debit of
-- the cached balance, the charge with a fresh random 32-byte charge id, the outbox event.
-- Refusals (the transaction rolls back, nothing is recorded, a retry with the same key may succeed
-- later): 22023 bad arguments, 23505 idempotency key reused for a different request, 55000
-- admission halted (operator or gas halt), PG402 insufficient cached balance.
-- Admission hardening (all admit_* functions and create_subscription): what a hostile or broken
-- API caller can send is refused with a clear message and a stable SQLSTATE before anything is
-- written, never with a raw overflow, check-constraint or datetime error:
--   22023 invalid_parameter_value: every malformed argument (the message names the argument);
--   23505 key reused for another request, 55000 admission halted, 42501 not allow-listed,
--   PG402 no funds / no fee budget.
-- What SQL cannot see (signatures, the network an entry was signed for, the USDC contract a
-- deposit names) is checked by the workers, which quarantine the row with its reason. NUL bytes
-- never reach these functions: PostgreSQL text cannot hold them (the server answers 22021 first).
CREATE OR REPLACE FUNCTION paygate.admit_charge(
    p_account text, p_amount numeric, p_idempotency_key text,
    p_description text DEFAULT NULL, p_subscription_id bigint DEFAULT NULL,
    p_period_start timestamptz DEFAULT NULL, p_idempotency_ttl interval DEFAULT interval '24 hours'
) RETURNS TABLE (charge_row_id bigint, charge_id bytea, balance numeric, replayed boolean)
LANGUAGE plpgsql AS $$
DECLARE
    v_request_hash bytea;
    v_existing paygate.idempotency_keys%ROWTYPE;
    v_inserted boolean;
    v_balance numeric;
    v_id bigint;
    v_charge_id bytea;
    v_problem text;
BEGIN
    v_problem := paygate.admission_key_problem(p_idempotency_key);
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION 'admit_charge: idempotency key %', v_problem USING ERRCODE = '22023';
    END IF;
    IF NOT (paygate.strkey_is_valid(p_account, 'G') OR paygate.strkey_is_valid(p_account, 'C')) THEN
        RAISE EXCEPTION 'admit_charge: account is not a Stellar address (G... or C..., 56 characters, valid checksum)'
            USING ERRCODE = '22023';
    END IF;
    IF paygate.i128_amount_problem(p_amount) IS NOT NULL THEN
        RAISE EXCEPTION 'admit_charge: amount %', paygate.i128_amount_problem(p_amount) USING ERRCODE = '22023';
    END IF;
    IF (p_subscription_id IS NULL) <> (p_period_start IS NULL) THEN
        RAISE EXCEPTION 'admit_charge: subscription_id and period_start go together' USING ERRCODE = '22023';
    END IF;
    IF p_period_start IS NOT NULL AND NOT isfinite(p_period_start) THEN
        RAISE EXCEPTION 'admit_charge: period_start must be a finite time' USING ERRCODE = '22023';
    END IF;
    IF p_subscription_id IS NOT NULL AND NOT EXISTS (
            SELECT 1 FROM paygate.subscriptions WHERE id = p_subscription_id AND account = p_account) THEN
        RAISE EXCEPTION 'admit_charge: subscription % of this account does not exist', p_subscription_id
            USING ERRCODE = '22023';
    END IF;
    IF length(p_description) > 1000 THEN
        RAISE EXCEPTION 'admit_charge: description must be at most 1000 characters' USING ERRCODE = '22023';
    END IF;
    IF paygate.idempotency_ttl_problem(p_idempotency_ttl) IS NOT NULL THEN
        RAISE EXCEPTION 'admit_charge: %', paygate.idempotency_ttl_problem(p_idempotency_ttl) USING ERRCODE = '22023';
    END IF;
    v_request_hash := sha256(convert_to(concat_ws('|', p_account, p_amount::text, coalesce(p_description, ''),
                                                  coalesce(p_subscription_id::text, ''),
                                                  coalesce(p_period_start::text, '')), 'UTF8'));

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

    -- A one-off charge: 32 bytes from two random UUIDs (244 random bits), unguessable and
    -- collision-free in practice; the UNIQUE constraint makes a collision an error, never a shared id.
    -- A subscription period: derived from what names the period for good (the subscription's own
    -- idempotency key, its account, the period's start), so a database restored to before the period
    -- was charged admits it again under the SAME id, and the contract, which never debits an id twice,
    -- refuses the second debit (docs/architecture.md §8). A random id there would be charged twice.
    IF p_subscription_id IS NULL THEN
        v_charge_id := uuid_send(gen_random_uuid()) || uuid_send(gen_random_uuid());
    ELSE
        v_charge_id := sha256(convert_to(concat_ws('|', 'paygate:subscription-period',
            (SELECT idempotency_key FROM paygate.subscriptions WHERE id = p_subscription_id), p_account,
            to_char(p_period_start AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US')), 'UTF8'));
    END IF;
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
