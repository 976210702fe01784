-- A webhook's event id (what receivers dedupe on) is drawn by the database for each outbox row
-- (gen_random_uuid(): 122 random bits) and never written or looked up by paygate afterwards, so
-- the unique index on it guarded nothing the generator does not already guarantee. It cost an
-- entry at a random place in a table-sized index on every insert and on every change of a row's
-- status (a claim, a delivery, a retry: none can be a HOT update, the status is in the partial
-- indexes' predicates), and a level of that index per claimed row as history grows
-- (bench/growth.py, docs/performance.md). Dropping it takes a brief exclusive lock on the table.
ALTER TABLE paygate.webhook_outbox DROP CONSTRAINT webhook_outbox_event_id_key;
-- Room on each page for the next version of its rows, as paygate.charges has (sql/0001_baseline.sql):
-- an outbox row is rewritten at least twice (claimed, then delivered, retried or dead), and where
-- its page has room the new version stays on it. Pages written from now on keep 30% free.
ALTER TABLE paygate.webhook_outbox SET (fillfactor = 70);
