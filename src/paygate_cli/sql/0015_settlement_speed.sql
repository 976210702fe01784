-- Settlement's claim (workers/settlement.py CLAIM_SQL) locks the oldest claimable charges in
-- (created_at, id) order with FOR UPDATE SKIP LOCKED. With only created_at indexed, the planner
-- sorted every claimable row before locking the first batch (the LIMIT sits above the row locks, so
-- the sort cannot stop early): each claim cost grew with the backlog (8,000 waiting charges: a
-- sequential scan and a 1 MB sort per batch of 48). Indexed in claim order, a claim reads its batch
-- and stops. Same predicate as the index it replaces, so has-work checks still use it.
CREATE INDEX charges_claim_order ON paygate.charges (created_at, id)
    WHERE status = 'authorized' AND claimed_at IS NULL AND lineage_id IS NULL;
DROP INDEX paygate.charges_claimable;
