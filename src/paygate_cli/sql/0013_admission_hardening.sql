-- Admission hardening: what a hostile or broken API caller can send is refused with a
-- clear message and a stable SQLSTATE before anything is written, never with a raw overflow,
-- check-constraint or datetime error, and never accepted when it is malformed.
--   22023 invalid_parameter_value: every malformed argument (the message names the argument).
--   23505, 55000, 42501, PG402: unchanged (key reused, admission halted, not allow-listed, no funds/budget).
-- What SQL still cannot see (signatures, the network an entry was signed for, the USDC contract a
-- deposit names) is checked by the workers, which quarantine the row with its reason.
-- NUL bytes never reach these functions: PostgreSQL text cannot hold them (drivers refuse them, the
-- server answers 22021 before any function runs), so such a request writes nothing either.

-- A StrKey address of one kind: 'G' (ed25519 account, version byte 6 << 3) or 'C' (contract,
-- 2 << 3), base32 of version byte + 32-byte payload + CRC16-XModem (little-endian). The pattern
-- alone lets a one-character typo through (it would be admitted and fail on chain, or worse,
-- sit in accounts for ever): the checksum catches it here.
CREATE FUNCTION paygate.strkey_is_valid(p_address text, p_kind text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    alphabet constant text := 'ABCDEFGHIJKLMNOPQRSTUVWXYZ234567';
    raw bytea := decode(repeat('00', 35), 'hex');
    acc bigint;
    crc integer := 0;
BEGIN
    IF p_address IS NULL OR p_kind NOT IN ('G', 'C') OR p_address !~ ('^' || p_kind || '[A-Z2-7]{55}$') THEN
        RETURN false;
    END IF;
    FOR g IN 0..6 LOOP   -- 8 base32 characters = 5 bytes
        acc := 0;
        FOR i IN 1..8 LOOP
            acc := acc * 32 + (strpos(alphabet, substr(p_address, g * 8 + i, 1)) - 1);
        END LOOP;
        FOR i IN 0..4 LOOP
            raw := set_byte(raw, g * 5 + i, ((acc >> (8 * (4 - i))) & 255)::integer);
        END LOOP;
    END LOOP;
    -- (no CASE inside IF: PL/pgSQL ends an IF condition at the first THEN)
    IF get_byte(raw, 0) <> (2 + 4 * (p_kind = 'G')::integer) << 3 THEN
        RETURN false;
    END IF;
    FOR i IN 0..32 LOOP
        crc := crc # (get_byte(raw, i) << 8);
        FOR k IN 1..8 LOOP
            crc := CASE WHEN crc & 32768 <> 0 THEN ((crc << 1) # 4129) & 65535 ELSE (crc << 1) & 65535 END;
        END LOOP;
    END LOOP;
    RETURN crc = get_byte(raw, 33) + (get_byte(raw, 34) << 8);
END
$$;

-- Why an idempotency key (or job key) is unacceptable, or NULL. Keys are opaque, but they are
-- printed by operator commands and logged: control characters, invisible and bidirectional
-- formatting characters (two keys that look identical, a key that reorders a log line) and
-- noncharacters are refused.
CREATE FUNCTION paygate.admission_key_problem(p_key text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN p_key IS NULL OR length(p_key) NOT BETWEEN 1 AND 255 THEN 'must be 1..255 characters'
        WHEN p_key ~ '[\u0001-\u001f\u007f-\u009f]' THEN 'must be 1..255 characters without control characters'
        WHEN p_key ~ '[\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff\ufff9-\ufffb]'
            THEN 'must not contain invisible or bidirectional formatting characters'
        WHEN p_key ~ '[\ufdd0-\ufdef\ufffe\uffff]' THEN 'must not contain Unicode noncharacters'
    END
$$;

-- Why an amount is not a positive i128, or NULL. numeric also holds NaN and ±Infinity, which
-- compare in surprising ways (NaN > 0 is true), so they are named first.
CREATE FUNCTION paygate.i128_amount_problem(p_amount numeric) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN p_amount IS NULL OR p_amount = 'NaN'::numeric OR p_amount <= 0 OR p_amount <> trunc(p_amount)
             OR p_amount >= 2::numeric ^ 127
            THEN 'must be a positive integer below 2^127'
    END
$$;

CREATE FUNCTION paygate.idempotency_ttl_problem(p_ttl interval) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p_ttl IS NULL OR p_ttl <= interval '0' OR p_ttl > interval '366 days'
                THEN 'idempotency TTL must be more than 0 and at most 366 days' END
$$;

CREATE OR REPLACE FUNCTION paygate.admit_deposit(
    p_account text, p_amount numeric, p_auth_entry text, p_auth_nonce bigint,
    p_auth_expiration_ledger integer, p_idempotency_key text,
    p_idempotency_ttl interval DEFAULT interval '24 hours'
) RETURNS TABLE (deposit_id bigint, replayed boolean)
LANGUAGE plpgsql AS $$
DECLARE
    v_request_hash bytea;
    v_existing paygate.idempotency_keys%ROWTYPE;
    v_id bigint;
    v_problem text;
BEGIN
    v_problem := paygate.admission_key_problem(p_idempotency_key);
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION 'admit_deposit: idempotency key %', v_problem USING ERRCODE = '22023';
    END IF;
    IF NOT paygate.strkey_is_valid(p_account, 'G') THEN
        RAISE EXCEPTION 'admit_deposit: account is not a Stellar account address (G..., 56 characters, valid checksum)'
            USING ERRCODE = '22023';
    END IF;
    IF paygate.i128_amount_problem(p_amount) IS NOT NULL THEN
        RAISE EXCEPTION 'admit_deposit: amount %', paygate.i128_amount_problem(p_amount) USING ERRCODE = '22023';
    END IF;
    IF p_auth_entry IS NULL OR length(p_auth_entry) > 16384 OR p_auth_entry !~ '^[A-Za-z0-9+/]+={0,2}$'
       OR length(p_auth_entry) % 4 <> 0 THEN
        RAISE EXCEPTION 'admit_deposit: auth_entry is not base64 XDR (at most 16384 characters)' USING ERRCODE = '22023';
    END IF;
    IF p_auth_nonce IS NULL THEN
        RAISE EXCEPTION 'admit_deposit: auth nonce is required' USING ERRCODE = '22023';
    END IF;
    IF p_auth_expiration_ledger IS NULL OR p_auth_expiration_ledger <= 0 THEN
        RAISE EXCEPTION 'admit_deposit: auth expiration ledger must be positive' USING ERRCODE = '22023';
    END IF;
    IF paygate.idempotency_ttl_problem(p_idempotency_ttl) IS NOT NULL THEN
        RAISE EXCEPTION 'admit_deposit: %', paygate.idempotency_ttl_problem(p_idempotency_ttl) USING ERRCODE = '22023';
    END IF;
    IF EXISTS (SELECT 1 FROM paygate.halts) THEN
        RAISE EXCEPTION 'admit_deposit: admission is halted (%)',
            (SELECT string_agg(kind || ': ' || reason, '; ') FROM paygate.halts) USING ERRCODE = '55000';
    END IF;

    v_request_hash := sha256(convert_to(concat_ws('|', p_account, p_amount::text, p_auth_entry,
                                                  p_auth_nonce::text, p_auth_expiration_ledger::text), 'UTF8'));
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

    -- One authorisation is one transfer: a second request carrying it (another key) is refused by
    -- UNIQUE (account, auth_nonce); said here in words (a race still gets the constraint's 23505).
    SELECT id INTO v_id FROM paygate.deposits WHERE account = p_account AND auth_nonce = p_auth_nonce;
    IF FOUND THEN
        RAISE EXCEPTION 'admit_deposit: the authorisation with nonce % of this account was already admitted '
            '(deposit %)', p_auth_nonce, v_id USING ERRCODE = '23505';
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

CREATE OR REPLACE FUNCTION paygate.create_subscription(
    p_account text, p_amount numeric, p_period interval, p_anchor timestamptz, p_idempotency_key text,
    p_description text DEFAULT NULL
) RETURNS TABLE (subscription_id bigint, replayed boolean)
LANGUAGE plpgsql AS $$
DECLARE
    v_existing paygate.subscriptions%ROWTYPE;
    v_id bigint;
    v_problem text;
BEGIN
    v_problem := paygate.admission_key_problem(p_idempotency_key);
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION 'create_subscription: idempotency key %', v_problem USING ERRCODE = '22023';
    END IF;
    IF NOT (paygate.strkey_is_valid(p_account, 'G') OR paygate.strkey_is_valid(p_account, 'C')) THEN
        RAISE EXCEPTION 'create_subscription: account is not a Stellar address (G... or C..., 56 characters, '
            'valid checksum)' USING ERRCODE = '22023';
    END IF;
    -- Each period's charge must itself be admissible: the same i128 bound as admit_charge (the old
    -- check let NaN through, and an amount of 10^39 failed with a raw numeric overflow).
    IF paygate.i128_amount_problem(p_amount) IS NOT NULL THEN
        RAISE EXCEPTION 'create_subscription: amount %', paygate.i128_amount_problem(p_amount) USING ERRCODE = '22023';
    END IF;
    -- Periods are derived as anchor + k * period for years: bounded so that arithmetic stays in range.
    IF p_period IS NULL OR p_period < interval '1 minute' OR p_period > interval '10 years' THEN
        RAISE EXCEPTION 'create_subscription: period must be between one minute and ten years' USING ERRCODE = '22023';
    END IF;
    IF p_anchor IS NULL OR NOT isfinite(p_anchor) OR p_anchor NOT BETWEEN now() - interval '100 years'
                                                                      AND now() + interval '100 years' THEN
        RAISE EXCEPTION 'create_subscription: anchor must be a finite time within 100 years of now'
            USING ERRCODE = '22023';
    END IF;
    IF length(p_description) > 1000 THEN
        RAISE EXCEPTION 'create_subscription: description must be at most 1000 characters' USING ERRCODE = '22023';
    END IF;
    SELECT * INTO v_existing FROM paygate.subscriptions WHERE idempotency_key = p_idempotency_key;
    IF FOUND THEN
        IF (v_existing.account, v_existing.amount, v_existing.period, v_existing.anchor)
           IS DISTINCT FROM (p_account, p_amount, p_period, p_anchor) THEN
            RAISE EXCEPTION 'create_subscription: idempotency key % was used for a different subscription',
                p_idempotency_key USING ERRCODE = '23505';
        END IF;
        RETURN QUERY SELECT v_existing.id, true;
        RETURN;
    END IF;
    INSERT INTO paygate.accounts (address) VALUES (p_account) ON CONFLICT (address) DO NOTHING;
    INSERT INTO paygate.subscriptions (account, amount, period, anchor, description, next_period_start,
                                       idempotency_key)
    VALUES (p_account, p_amount, p_period, p_anchor, p_description, p_anchor, p_idempotency_key)
    RETURNING id INTO v_id;
    PERFORM paygate.emit_event('subscription.created', jsonb_build_object(
        'subscription_id', v_id, 'account', p_account, 'amount', p_amount::text, 'period', p_period::text,
        'anchor', p_anchor));
    RETURN QUERY SELECT v_id, false;
END
$$;

-- Relays: the checksum on both addresses, a one-dimensional entry array, a bounded TTL.
CREATE OR REPLACE FUNCTION paygate.admit_relay(
    p_account text, p_contract text, p_function text, p_args_xdr text, p_auth_entries text[],
    p_max_fee bigint, p_idempotency_key text, p_idempotency_ttl interval DEFAULT interval '24 hours'
) RETURNS TABLE (relay_id bigint, reserved_fee bigint, replayed boolean)
LANGUAGE plpgsql AS $$
DECLARE
    v_request_hash bytea;
    v_problem text;
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
    v_problem := paygate.admission_key_problem(p_idempotency_key);
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION 'admit_relay: idempotency key %', v_problem USING ERRCODE = '22023';
    END IF;
    IF NOT (paygate.strkey_is_valid(p_account, 'G') OR paygate.strkey_is_valid(p_account, 'C')) THEN
        RAISE EXCEPTION 'admit_relay: account is not a Stellar address (G... or C..., 56 characters, valid checksum)'
            USING ERRCODE = '22023';
    END IF;
    IF NOT paygate.strkey_is_valid(p_contract, 'C') THEN
        RAISE EXCEPTION 'admit_relay: contract is not a contract address (C..., 56 characters, valid checksum)'
            USING ERRCODE = '22023';
    END IF;
    IF p_function IS NULL OR p_function !~ '^[A-Za-z0-9_]{1,32}$' THEN
        RAISE EXCEPTION 'admit_relay: function is not a contract function name (1..32 of A-Z a-z 0-9 _)'
            USING ERRCODE = '22023';
    END IF;
    IF p_args_xdr IS NULL OR length(p_args_xdr) > 65536 OR p_args_xdr !~ '^[A-Za-z0-9+/]+={0,2}$'
       OR length(p_args_xdr) % 4 <> 0 THEN
        RAISE EXCEPTION 'admit_relay: args_xdr is not base64 XDR (at most 65536 characters)' USING ERRCODE = '22023';
    END IF;
    v_args := decode(p_args_xdr, 'base64');
    -- SCVal { type = SCV_VEC (16), optional<SCVec> present (1) }: the argument list of the call.
    IF length(v_args) < 8 OR substring(v_args FROM 1 FOR 8) <> '\x0000001000000001'::bytea THEN
        RAISE EXCEPTION 'admit_relay: args_xdr must be an SCVal vector of the call''s arguments' USING ERRCODE = '22023';
    END IF;
    IF p_auth_entries IS NULL OR cardinality(p_auth_entries) NOT BETWEEN 1 AND 8
       OR array_ndims(p_auth_entries) <> 1 THEN
        RAISE EXCEPTION 'admit_relay: 1..8 auth entries are required (a one-dimensional array)'
            USING ERRCODE = '22023';
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
    IF paygate.idempotency_ttl_problem(p_idempotency_ttl) IS NOT NULL THEN
        RAISE EXCEPTION 'admit_relay: %', paygate.idempotency_ttl_problem(p_idempotency_ttl) USING ERRCODE = '22023';
    END IF;
    v_request_hash := sha256(convert_to(concat_ws('|', p_account, p_contract, p_function, p_args_xdr,
                                                  array_to_string(p_auth_entries, ','), p_max_fee::text), 'UTF8'));

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
    v_reserved := paygate.take_relay_fee_budget(p_max_fee);
    IF v_reserved IS NULL THEN
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

-- Bot jobs: the job key rule and the contract checksum, as for relays.
CREATE OR REPLACE FUNCTION paygate.admit_bot_job(
    p_job_key text, p_contract text, p_function text, p_args_xdr text, p_max_attempts integer DEFAULT NULL
) RETURNS TABLE (bot_job_id bigint, replayed boolean)
LANGUAGE plpgsql AS $$
DECLARE
    v_request_hash bytea := sha256(convert_to(concat_ws('|', p_contract, p_function, p_args_xdr), 'UTF8'));
    v_existing paygate.bot_jobs%ROWTYPE;
    v_args bytea;
    v_id bigint;
    v_problem text;
BEGIN
    v_problem := paygate.admission_key_problem(p_job_key);
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION 'admit_bot_job: job key %', v_problem USING ERRCODE = '22023';
    END IF;
    IF NOT paygate.strkey_is_valid(p_contract, 'C') THEN
        RAISE EXCEPTION 'admit_bot_job: contract is not a contract address (C..., 56 characters, valid checksum)'
            USING ERRCODE = '22023';
    END IF;
    IF p_function IS NULL OR p_function !~ '^[A-Za-z0-9_]{1,32}$' THEN
        RAISE EXCEPTION 'admit_bot_job: function is not a contract function name (1..32 of A-Z a-z 0-9 _)'
            USING ERRCODE = '22023';
    END IF;
    IF p_args_xdr IS NULL OR length(p_args_xdr) > 65536 OR p_args_xdr !~ '^[A-Za-z0-9+/]+={0,2}$'
       OR length(p_args_xdr) % 4 <> 0 THEN
        RAISE EXCEPTION 'admit_bot_job: args_xdr is not base64 XDR (at most 65536 characters)' USING ERRCODE = '22023';
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
