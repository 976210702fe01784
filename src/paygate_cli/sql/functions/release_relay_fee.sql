-- Closing a reservation and moving the accumulator are one statement: whoever wins
-- reserved -> released applies the totals; a loser's statement matches no row.
CREATE OR REPLACE FUNCTION paygate.release_relay_fee(p_relay_id bigint, p_reason text)
RETURNS boolean LANGUAGE sql AS $$
    WITH flipped AS (
        UPDATE paygate.fee_reservations
        SET status = 'released', reason = p_reason, closed_at = now()
        WHERE relay_id = p_relay_id AND status = 'reserved'
        RETURNING amount
    ), totals AS (
        UPDATE paygate.relay_fee_totals t
        SET reserved = t.reserved - f.amount, released = t.released + f.amount, updated_at = now()
        FROM flipped f RETURNING 1
    )
    SELECT EXISTS (SELECT 1 FROM totals)
$$;
