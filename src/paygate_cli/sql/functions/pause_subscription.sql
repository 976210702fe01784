-- Paused: no periods are charged while paused, and on resume the periods that passed meanwhile
-- are skipped (the next charge is the first period starting at or after the resume).
CREATE OR REPLACE FUNCTION paygate.pause_subscription(p_id bigint) RETURNS boolean
LANGUAGE sql AS $$
    WITH paused AS (
        UPDATE paygate.subscriptions SET status = 'paused', retry_at = NULL, past_due_since = NULL,
                                         updated_at = now()
        WHERE id = p_id AND status IN ('active', 'past_due') RETURNING id
    )
    SELECT EXISTS (SELECT 1 FROM paused)
$$;
