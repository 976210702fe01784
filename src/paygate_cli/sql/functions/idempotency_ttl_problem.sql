-- Why an idempotency TTL is unacceptable, or NULL.
CREATE OR REPLACE FUNCTION paygate.idempotency_ttl_problem(p_ttl interval) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p_ttl IS NULL OR p_ttl <= interval '0' OR p_ttl > interval '366 days'
                THEN 'idempotency TTL must be more than 0 and at most 366 days' END
$$;
