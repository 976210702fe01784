-- 0017: settlement's claim touches no index that grows with all history but the ones it must.
--
-- The claim records its batch on each claimed charge (lineage_id, claimed_at): columns in the
-- claimable index's predicate, so the update is not HOT and every index whose predicate the new
-- row version matches gets an entry. UNIQUE (subscription_id, period_start) indexed every charge,
-- one-off ones included (a B-tree keeps NULL keys), although only subscription charges can ever
-- collide (NULLs never do): at millions of history rows that index is one level deeper, and each
-- claimed one-off charge paid for it. The same guard as a partial unique index over the
-- subscription charges only: the same rows are refused, and a one-off charge's claim skips it.
CREATE UNIQUE INDEX charges_subscription_period ON paygate.charges (subscription_id, period_start)
    WHERE subscription_id IS NOT NULL;
ALTER TABLE paygate.charges DROP CONSTRAINT charges_subscription_id_period_start_key;

-- charges (account) indexed every charge ever made for a lookup nothing makes: the queries that read
-- charges by account read the open ones (charges_open_account, which stays small), and accounts are
-- never deleted, so the foreign key needs no index on this side. Each claimed charge paid for an
-- entry in it.
DROP INDEX paygate.charges_account;

-- Room on each page of charges for the next version of its rows. A charge is rewritten twice (claimed,
-- then settled or failed), and neither can be HOT (each changes an indexed column: 0016 left charges
-- at 100% for that reason), but where the page has room the new version stays on it: no free-space-
-- map search, no other heap page touched. Measured (bench/growth.py, 10 k vs 5 M history rows): the
-- claim's buffers grew 1.25x without it, 1.20x with it; the observer's settle of a page touched 9%
-- fewer. The price: the hot table's heap is ~40% larger for the same rows (retention moves terminal
-- charges out after its window, so that is bounded). Applies to pages filled from now on.
ALTER TABLE paygate.charges SET (fillfactor = 70);
