-- Why an amount is not a positive i128, or NULL. numeric also holds NaN and ±Infinity, which
-- compare in surprising ways (NaN > 0 is true), so they are named first.
CREATE OR REPLACE FUNCTION paygate.i128_amount_problem(p_amount numeric) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN p_amount IS NULL OR p_amount = 'NaN'::numeric OR p_amount <= 0 OR p_amount <> trunc(p_amount)
             OR p_amount >= 2::numeric ^ 127
            THEN 'must be a positive integer below 2^127'
    END
$$;
