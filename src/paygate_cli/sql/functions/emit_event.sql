-- Domain events: written in the same transaction as the state change they announce, fanned out
-- to every enabled webhook endpoint.
CREATE OR REPLACE FUNCTION paygate.emit_event(p_type text, p_payload jsonb) RETURNS integer
LANGUAGE sql AS $$
    WITH inserted AS (
        INSERT INTO paygate.webhook_outbox (endpoint_id, event_type, payload)
        SELECT e.id, p_type, p_payload FROM paygate.webhook_endpoints e WHERE e.enabled
        RETURNING 1
    )
    SELECT count(*)::integer FROM inserted
$$;
