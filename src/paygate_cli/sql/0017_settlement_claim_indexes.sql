-- 0017: settlement's claim touches no index that grows with all history but the ones it must (issue 14).
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
