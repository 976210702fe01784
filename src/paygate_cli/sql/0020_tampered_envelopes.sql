-- An envelope that no longer decrypts (altered or swapped ciphertext) stops its unit for a human and
-- blocks nothing else (docs/architecture.md §4 "Envelopes are encrypted").
--
-- Such a lineage is PARKED, not terminal: its signed bytes may still be queued somewhere and land,
-- so it is never called expired or abandoned by guess. It stays live (state signed/sent), so it
-- keeps holding its lane's one live slot and its entitlement, and nonce-inspect and
-- key-retire-check still see it; resolve still reads its receipt by hash (no decryption needed) and
-- records applied/failed/expired when the chain proves one, and only the resend is skipped. The lane
-- is fenced (drained, with drain_reason) in the same statement that parks it.
ALTER TABLE paygate.lineages ADD COLUMN parked_at timestamptz,
                             ADD COLUMN parked_reason text,
                             ADD CONSTRAINT lineages_parked_has_reason CHECK ((parked_at IS NULL) = (parked_reason IS NULL));
ALTER TABLE paygate_archive.lineages ADD COLUMN parked_at timestamptz,
                                     ADD COLUMN parked_reason text;

-- A charge whose batch's envelope cannot be decrypted: still debited in the cached balance, held
-- by its lineage (never claimable again), and waiting for a human, with the reason.
ALTER TABLE paygate.charges DROP CONSTRAINT charges_status_check;
ALTER TABLE paygate.charges ADD CONSTRAINT charges_status_check
    CHECK (status IN ('authorized', 'settled', 'failed', 'needs_human'));
ALTER TABLE paygate.charges ADD CONSTRAINT charges_needs_human_has_reason
    CHECK (status <> 'needs_human' OR reason IS NOT NULL);
-- Its batch is closed as handed to a human (its lineage is swept to a terminal state by the chain).
ALTER TABLE paygate.charge_batches DROP CONSTRAINT charge_batches_outcome_check;
ALTER TABLE paygate.charge_batches ADD CONSTRAINT charge_batches_outcome_check
    CHECK (outcome IN ('applied', 'dead', 'abandoned', 'needs_human'));
