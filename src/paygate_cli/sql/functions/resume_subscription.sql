-- Resuming skips the periods that passed while paused: the next period is the first one starting at
-- or after now (see pause_subscription).
CREATE OR REPLACE FUNCTION paygate.resume_subscription(p_id bigint) RETURNS boolean
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
