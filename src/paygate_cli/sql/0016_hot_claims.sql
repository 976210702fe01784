-- 0016: a claim is a HOT update, so its cost does not grow with history.
--
-- A claim (and a lease release or renewal) rewrites lease_token, lease_expires_at, claimed_by,
-- attempts and updated_at of rows it leaves in their status. PostgreSQL updates a row "heap only"
-- (HOT: the new version on the same page, chained from the old one, and NO new index entry) when no
-- column it changes appears in any index of the table (key, expression or partial-index predicate)
-- and the row's page has room. Otherwise every index gets a new entry for the row, and the deep
-- ones (primary key, unique keys: one level deeper at millions of history rows) cost more buffers
-- per claimed row as history grows. tests/test_hot_claims.py holds each claim to being HOT.

-- The needs_human queue depths (ops/status.py: count and oldest updated_at) were indexed on
-- updated_at, which every claim, release and renewal of a pending deposit or a queued relay writes.
-- Indexed on id instead (never written): the same partial set, so the depth query still reads only
-- the needs_human rows (a few, each read once for its updated_at), and those writes become HOT.
DROP INDEX paygate.deposits_needs_human;
CREATE INDEX deposits_needs_human ON paygate.deposits (id) WHERE status = 'needs_human';
DROP INDEX paygate.relays_needs_human;
CREATE INDEX relays_needs_human ON paygate.relays (id) WHERE status = 'needs_human';

-- Room on each page for the new versions of its rows, for the queue tables whose rows are claimed,
-- renewed and released in place. A claim takes every claimable row of a page at once (a batch of 16
-- or 25 admitted between two ticks spans a page or two; a backlog fills pages before they are
-- claimed), and the old versions stay until the claim commits, so a page needs room for a second
-- copy of its rows: 50%. Measured (tests/test_hot_claims.py, rows of real size): at 80% a claim of
-- 16 freshly admitted rows was HOT for 4, at 70% for 8, at 60% for 12, at 50% for all. The price:
-- these three tables keep their history (retention does not move them), so their heap takes about
-- twice the space for the same rows; their indexes, and every index entry a non-HOT claim would add
-- per claimed row (into indexes that are deeper at millions of rows), do not. Applies to pages filled
-- from now on (existing pages keep what they hold until rewritten). Not set on the tables whose every
-- update changes an indexed column anyway, so could never be HOT and would only carry the empty
-- space through their millions of history rows: charges (settlement's claim records lineage_id and
-- claimed_at, which key the lineage index and the claim-order index's predicate), webhook_outbox (its
-- claim, take-over and settle each change status, which every partial index of it names) and
-- subscriptions (its claim is a row lock; its updates move next_period_start/retry_at).
ALTER TABLE paygate.deposits SET (fillfactor = 50);
ALTER TABLE paygate.relays SET (fillfactor = 50);
ALTER TABLE paygate.bot_jobs SET (fillfactor = 50);
