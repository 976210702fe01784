-- Closing a reservation and moving the accumulator are one statement: whoever wins
-- reserved -> settled applies the totals; a loser's statement matches no row. The receipt is named
-- by its lineage and its transaction's hash; a relay settled from the chain alone (a restore lost
-- the lineage that sent it) has the hash only.
DROP FUNCTION IF EXISTS paygate.settle_relay_fee(bigint, bigint, bigint);
CREATE OR REPLACE FUNCTION paygate.settle_relay_fee(p_relay_id bigint, p_lineage_id bigint, p_fee bigint,
                                                    p_tx_hash bytea)
RETURNS boolean LANGUAGE sql AS $$
    WITH flipped AS (
        UPDATE paygate.fee_reservations
        SET status = 'settled', fee_charged = p_fee, lineage_id = p_lineage_id, tx_hash = p_tx_hash,
            closed_at = now()
        WHERE relay_id = p_relay_id AND status = 'reserved'
        RETURNING amount
    ), totals AS (
        UPDATE paygate.relay_fee_totals t
        SET reserved = t.reserved - f.amount, settled = t.settled + p_fee, updated_at = now()
        FROM flipped f RETURNING 1
    )
    SELECT EXISTS (SELECT 1 FROM totals)
$$;
