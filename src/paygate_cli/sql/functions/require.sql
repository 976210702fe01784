-- What the phase engine needs to write a phase in one statement. The engine folds a phase's lease
-- check, its lineage transition and the row's own update into one statement (data-modifying CTEs)
-- instead of a BEGIN … COMMIT of three or four. A CTE cannot roll back a sibling on its own, so the
-- statement ends in paygate.require(all parts agree): when they do not (a lease lost between the
-- parts, a lineage no longer in the state expected), it raises and the whole statement — every
-- part — rolls back, exactly as the multi-statement transaction did.
CREATE OR REPLACE FUNCTION paygate.require(p_ok boolean, p_what text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF p_ok IS NOT TRUE THEN
        -- A private SQLSTATE: the engine maps exactly this one to "lease lost, nothing written".
        RAISE EXCEPTION 'paygate: % (statement rolled back)', p_what USING ERRCODE = 'PGR01';
    END IF;
    RETURN true;
END $$;
