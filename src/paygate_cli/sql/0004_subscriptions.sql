-- Subscriptions (docs/architecture.md §5): one charge per period, through the same admission path as one-off
-- charges. A period's start is derived, never chosen: anchor + k * period for k = 0, 1, 2, …;
-- charges.UNIQUE (subscription_id, period_start) makes a second charge for a period impossible.

CREATE TABLE paygate.subscriptions (
    id                  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    account             text NOT NULL REFERENCES paygate.accounts (address),
    amount              numeric(39,0) NOT NULL CHECK (amount > 0),
    period              interval NOT NULL CHECK (period >= interval '1 minute'),
    anchor              timestamptz NOT NULL,
    description         text CHECK (length(description) <= 1000),
    status              text NOT NULL DEFAULT 'active'
                        CHECK (status IN ('active', 'past_due', 'paused', 'cancelled')),
    next_period_index   integer NOT NULL DEFAULT 0 CHECK (next_period_index >= 0),
    next_period_start   timestamptz NOT NULL,   -- = anchor + next_period_index * period (kept in step)
    retry_at            timestamptz,            -- past_due: when the unpaid period is tried again
    past_due_since      timestamptz,
    idempotency_key     text NOT NULL,
    cancelled_at        timestamptz,
    cancel_reason       text,
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    UNIQUE (idempotency_key),
    CHECK (next_period_start = anchor + next_period_index * period),
    CHECK ((status = 'past_due') = (past_due_since IS NOT NULL AND retry_at IS NOT NULL)),
    CHECK ((status = 'cancelled') = (cancelled_at IS NOT NULL))
);
CREATE INDEX subscriptions_due ON paygate.subscriptions (next_period_start) WHERE status = 'active';
CREATE INDEX subscriptions_retry ON paygate.subscriptions (retry_at) WHERE status = 'past_due';

ALTER TABLE paygate.charges
    ADD CONSTRAINT charges_subscription_fk FOREIGN KEY (subscription_id) REFERENCES paygate.subscriptions (id);

CREATE FUNCTION paygate.create_subscription(
    p_account text, p_amount numeric, p_period interval, p_anchor timestamptz, p_idempotency_key text,
    p_description text DEFAULT NULL
) RETURNS TABLE (subscription_id bigint, replayed boolean)
LANGUAGE plpgsql AS $$
DECLARE
    v_existing paygate.subscriptions%ROWTYPE;
    v_id bigint;
BEGIN
    IF p_account IS NULL OR p_account !~ '^[GC][A-Z2-7]{55}$' THEN
        RAISE EXCEPTION 'create_subscription: account % is not a Stellar address', p_account USING ERRCODE = '22023';
    END IF;
    IF p_amount IS NULL OR p_amount <= 0 OR p_amount <> trunc(p_amount) THEN
        RAISE EXCEPTION 'create_subscription: amount must be a positive integer' USING ERRCODE = '22023';
    END IF;
    IF p_period IS NULL OR p_period < interval '1 minute' THEN
        RAISE EXCEPTION 'create_subscription: period must be at least one minute' USING ERRCODE = '22023';
    END IF;
    IF p_anchor IS NULL OR p_idempotency_key IS NULL OR length(p_idempotency_key) NOT BETWEEN 1 AND 255 THEN
        RAISE EXCEPTION 'create_subscription: anchor and an idempotency key (1..255 chars) are required'
            USING ERRCODE = '22023';
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

-- Cancelling is terminal; charges already admitted still settle.
CREATE FUNCTION paygate.cancel_subscription(p_id bigint, p_reason text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE paygate.subscriptions
    SET status = 'cancelled', cancelled_at = now(), cancel_reason = p_reason, retry_at = NULL,
        past_due_since = NULL, updated_at = now()
    WHERE id = p_id AND status <> 'cancelled';
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM paygate.emit_event('subscription.cancelled', jsonb_build_object('subscription_id', p_id,
                                                                            'reason', p_reason));
    RETURN true;
END
$$;

-- Paused: no periods are charged while paused, and on resume the periods that passed meanwhile
-- are skipped (the next charge is the first period starting at or after the resume).
CREATE FUNCTION paygate.pause_subscription(p_id bigint) RETURNS boolean
LANGUAGE sql AS $$
    WITH paused AS (
        UPDATE paygate.subscriptions SET status = 'paused', retry_at = NULL, past_due_since = NULL,
                                         updated_at = now()
        WHERE id = p_id AND status IN ('active', 'past_due') RETURNING id
    )
    SELECT EXISTS (SELECT 1 FROM paused)
$$;

CREATE FUNCTION paygate.resume_subscription(p_id bigint) RETURNS boolean
LANGUAGE sql AS $$
    WITH resumed AS (
        UPDATE paygate.subscriptions s
        SET status = 'active', updated_at = now(),
            next_period_index = k.idx, next_period_start = s.anchor + k.idx * s.period
        FROM (SELECT id, greatest(next_period_index, (SELECT min(i) FROM generate_series(next_period_index,
                     next_period_index + 100000) AS i WHERE anchor + i * period >= now())) AS idx
              FROM paygate.subscriptions WHERE id = p_id) k
        WHERE s.id = p_id AND s.id = k.id AND s.status = 'paused' RETURNING s.id
    )
    SELECT EXISTS (SELECT 1 FROM resumed)
$$;
