-- A subscription (docs/architecture.md §5): one charge per period, through the same admission path
-- as one-off charges. Each period's charge must itself be admissible: the same i128 bound as
-- admit_charge.
-- Admission hardening (all admit_* functions and create_subscription): what a hostile or broken
-- API caller can send is refused with a clear message and a stable SQLSTATE before anything is
-- written, never with a raw overflow, check-constraint or datetime error:
--   22023 invalid_parameter_value: every malformed argument (the message names the argument);
--   23505 key reused for another request, 55000 admission halted, 42501 not allow-listed,
--   PG402 no funds / no fee budget.
-- What SQL cannot see (signatures, the network an entry was signed for, the USDC contract a
-- deposit names) is checked by the workers, which quarantine the row with its reason. NUL bytes
-- never reach these functions: PostgreSQL text cannot hold them (the server answers 22021 first).
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
