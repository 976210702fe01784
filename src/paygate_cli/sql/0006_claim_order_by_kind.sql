-- Settlement claims one-off charges ahead of subscription periods (docs/architecture.md §5 "Claim
-- order"): each kind is read in (created_at, id) order from its own partial index, so a claim
-- reads its batch and stops however many rows of the other kind wait (a billing run's backlog of
-- periods never lengthens a checkout charge's claim, nor a backlog of one-off charges a period's).
-- They replace the one index both kinds shared. Building them reads paygate.charges once, holding
-- off writes to it meanwhile: retention keeps the table to its window, so this takes seconds.
DROP INDEX paygate.charges_claim_order;
CREATE INDEX charges_claim_one_off ON paygate.charges (created_at, id)
    WHERE status = 'authorized' AND claimed_at IS NULL AND lineage_id IS NULL AND subscription_id IS NULL;
CREATE INDEX charges_claim_periods ON paygate.charges (created_at, id)
    WHERE status = 'authorized' AND claimed_at IS NULL AND lineage_id IS NULL AND subscription_id IS NOT NULL;
