-- before the schema: the lineages indexes of one live lineage per lane and per entitlement use it.
-- A live lineage (docs/architecture.md §4): allocated, signed or sent, i.e. it still holds its lane's
-- one slot and its entitlement. Written once here for the SQL files and for the statements workers
-- hold in Python. An inlinable SQL expression (IMMUTABLE, one SELECT): the planner replaces a call
-- by `state IN (...)`, so a query that spells the states out still matches an index built on it and
-- vice versa. An index built on it is not rebuilt when this file changes: a change of the live
-- states needs a migration that rebuilds those indexes (REINDEX) as well.
CREATE OR REPLACE FUNCTION paygate.lineage_is_live(state text) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT state IN ('allocated', 'signed', 'sent')
$$;
