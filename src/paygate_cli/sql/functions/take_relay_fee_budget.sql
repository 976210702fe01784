-- The budget rule, in one place for admission and replay: add `p_amount` to the open reservations
-- if the budget still covers it, under the accumulator's row lock (concurrent callers serialise
-- here, so the check and the increment cannot interleave). -> the new reserved total, or NULL when
-- the budget cannot cover it (nothing changed).
CREATE OR REPLACE FUNCTION paygate.take_relay_fee_budget(p_amount bigint) RETURNS bigint LANGUAGE sql AS $$
    UPDATE paygate.relay_fee_totals SET reserved = reserved + p_amount, updated_at = now()
    WHERE reserved + p_amount <= (SELECT fee_budget FROM paygate.relay_config)
    RETURNING reserved
$$;
