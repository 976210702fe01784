-- A restore of archived ledger entries, asked for by whoever met them (docs/architecture.md §6 "TTL
-- keeper"): a money path whose simulation answered with a restorePreamble (journal/engine.py, in the
-- transaction that hands its unit back), or the TTL keeper for an entry it read archived. The TTL
-- keeper sends it (workers/ttl.py). `p_keys`: base64 LedgerKey XDR; `p_by`: who asks ('ttl', or the
-- path and its unit).
--
-- One open restore per key: keys an open (pending) restore job already holds join it; the others
-- go into one new job. A job's keys never change once written (the keeper builds the transaction
-- from the keys it claimed, and marks exactly those restored), so a request never widens an open
-- job. Concurrent requests serialise on a transaction-scoped advisory lock (the single-bigint form:
-- apart from the workers' (namespace, key) locks), so two paths meeting the same entry at once
-- cannot both insert it. -> the id of the new job, or of an open one holding the keys.
CREATE OR REPLACE FUNCTION paygate.request_restore(p_keys text[], p_by text) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_keys text[];
    v_hashes bytea[];
    v_all bytea[];
    v_id bigint;
BEGIN
    IF p_keys IS NULL OR cardinality(p_keys) = 0 OR array_position(p_keys, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'request_restore: keys must be a non-empty array of base64 LedgerKey XDR'
            USING ERRCODE = '22023';
    END IF;
    IF p_by IS NULL OR length(p_by) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION 'request_restore: by must name who asks (1..200 characters)' USING ERRCODE = '22023';
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(p_keys) k WHERE k !~ '^[A-Za-z0-9+/]+={0,2}$' OR length(k) % 4 <> 0) THEN
        RAISE EXCEPTION 'request_restore: a key is not base64 XDR' USING ERRCODE = '22023';
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended('paygate.request_restore', 0));
    -- Each key once (first spelling wins), in the order asked; the ones no open restore holds.
    SELECT array_agg(d.h ORDER BY d.n),
           array_agg(d.k ORDER BY d.n) FILTER (WHERE NOT d.held),
           array_agg(d.h ORDER BY d.n) FILTER (WHERE NOT d.held)
    INTO v_all, v_keys, v_hashes
    FROM (
        SELECT DISTINCT ON (x.h) x.k, x.h, x.n,
               EXISTS (SELECT 1 FROM paygate.ttl_jobs j
                       WHERE j.kind = 'restore' AND j.status = 'pending' AND j.key_hashes @> ARRAY[x.h]) AS held
        FROM (SELECT u.k, sha256(decode(u.k, 'base64')) AS h, u.n
              FROM unnest(p_keys) WITH ORDINALITY AS u(k, n)) x
        ORDER BY x.h, x.n
    ) d;
    IF v_keys IS NULL THEN
        SELECT min(j.id) INTO v_id FROM paygate.ttl_jobs j
        WHERE j.kind = 'restore' AND j.status = 'pending' AND j.key_hashes && v_all;
        RETURN v_id;
    END IF;
    INSERT INTO paygate.ttl_jobs (kind, key_hashes, keys_xdr, requested_by)
    VALUES ('restore', v_hashes, v_keys, p_by)
    RETURNING id INTO v_id;
    RETURN v_id;
END
$$;
