-- Replay of relays and bot jobs (ops/replay.py). A replayed relay reserves its fee again,
-- so a relay may now hold several reservations over its life: one per admission or replay (its
-- `round`), at most one of them open. settle_relay_fee / release_relay_fee already close "the open
-- one" (relay_id AND status = 'reserved'), so they are unchanged; the closed rounds stay as history.
ALTER TABLE paygate.fee_reservations ADD COLUMN round integer NOT NULL DEFAULT 1 CHECK (round > 0);
ALTER TABLE paygate.fee_reservations DROP CONSTRAINT fee_reservations_pkey;
ALTER TABLE paygate.fee_reservations ADD PRIMARY KEY (relay_id, round);
CREATE UNIQUE INDEX fee_reservations_one_open ON paygate.fee_reservations (relay_id) WHERE status = 'reserved';

-- The budget rule, in one place for admission and replay: add `p_amount` to the open reservations
-- if the budget still covers it, under the accumulator's row lock (concurrent callers serialise
-- here, so the check and the increment cannot interleave). -> the new reserved total, or NULL when
-- the budget cannot cover it (nothing changed).
CREATE FUNCTION paygate.take_relay_fee_budget(p_amount bigint) RETURNS bigint LANGUAGE sql AS $$
    UPDATE paygate.relay_fee_totals SET reserved = reserved + p_amount, updated_at = now()
    WHERE reserved + p_amount <= (SELECT fee_budget FROM paygate.relay_config)
    RETURNING reserved
$$;

-- Admission, unchanged but for the budget rule, which it now takes from take_relay_fee_budget.
CREATE OR REPLACE FUNCTION paygate.admit_relay(
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
