-- Authorisations a restore may have seen used (docs/architecture.md §8 "Disaster recovery"). After a
-- restore, the lineage that sent a relay can be lost while its transaction landed. The relay worker
-- then proves that transaction from the chain (ours, carrying the relay's authorisation, by quorum)
-- and settles its fee with no lineage to name: the reservation names the transaction instead. Every
-- settlement records the transaction's hash from now on, a lineage's included.
ALTER TABLE paygate.fee_reservations ADD COLUMN tx_hash bytea CHECK (length(tx_hash) = 32);

-- The baseline's unnamed "settled = fee and lineage" CHECK, found by what it says (its generated
-- name is Postgres's choice), replaced by "settled = fee and (lineage or transaction)".
DO $$
DECLARE
    v_name text;
BEGIN
    SELECT conname INTO STRICT v_name FROM pg_constraint
    WHERE conrelid = 'paygate.fee_reservations'::regclass AND contype = 'c'
      AND pg_get_constraintdef(oid) LIKE '%fee_charged IS NOT NULL%lineage_id IS NOT NULL%';
    EXECUTE format('ALTER TABLE paygate.fee_reservations DROP CONSTRAINT %I', v_name);
END
$$;
ALTER TABLE paygate.fee_reservations ADD CONSTRAINT fee_reservations_settled_receipt
    CHECK ((status = 'settled') = (fee_charged IS NOT NULL AND (lineage_id IS NOT NULL OR tx_hash IS NOT NULL)));

-- paygate.admitted_before_restore reads the restore halts of the audit log by time.
CREATE INDEX audit_log_restore_halts ON paygate.audit_log (at) WHERE action = 'restore_halt';
