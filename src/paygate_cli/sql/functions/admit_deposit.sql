-- Admission of a deposit, called by the API service: shape checks, idempotency, insert, all in one
-- transaction. The deep checks (XDR decoding, signature, contract, amount, destination) run in the
-- funding worker, which quarantines a bad authorisation with its reason instead of retrying it.
-- Admission hardening (all admit_* functions and create_subscription): what a hostile or broken
-- API caller can send is refused with a clear message and a stable SQLSTATE before anything is
-- written, never with a raw overflow, check-constraint or datetime error:
--   22023 invalid_parameter_value: every malformed argument (the message names the argument);
--   23505 key reused for another request, 55000 admission halted, 42501 not allow-listed,
--   PG402 no funds / no fee budget.
-- What SQL cannot see (signatures, the network an entry was signed for, the USDC contract a
-- deposit names) is checked by the workers, which quarantine the row with its reason. NUL bytes
-- never reach these functions: PostgreSQL text cannot hold them (the server answers 22021 first).
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
