-- Admission of a relay, called by the API service. One transaction: idempotency record, the
-- relay, its fee reservation against the budget (take_relay_fee_budget), the accumulator, the
-- outbox event. Refusals (nothing is recorded; SQLSTATEs as admit_charge): 22023 bad arguments or
-- malformed auth entries (the checksum on both addresses, a one-dimensional entry array, a bounded
-- TTL), 23505 idempotency key reused for a different request, 55000 admission halted (operator or
-- gas halt), 42501 contract function not allow-listed, PG402 fee budget exhausted.
-- Admission hardening (all admit_* functions and create_subscription): what a hostile or broken
-- API caller can send is refused with a clear message and a stable SQLSTATE before anything is
-- written, never with a raw overflow, check-constraint or datetime error:
--   22023 invalid_parameter_value: every malformed argument (the message names the argument);
--   23505 key reused for another request, 55000 admission halted, 42501 not allow-listed,
--   PG402 no funds / no fee budget.
-- What SQL cannot see (signatures, the network an entry was signed for, the USDC contract a
-- deposit names) is checked by the workers, which quarantine the row with its reason. NUL bytes
-- never reach these functions: PostgreSQL text cannot hold them (the server answers 22021 first).
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
