-- The one way an operator resolves a lane fence (docs/architecture.md §4, rule 10), after explaining
-- the transactions in the finding's sequence range: the finding is resolved, the chain sequence it
-- recorded becomes the lane's accepted sequence, and the audit log says who did it, in one
-- transaction. The lane stays drained: `paygate undrain --lane` puts it back to work (undrain alone
-- resolves nothing, and a lane still ahead of the journal is fenced again at its next allocation).
CREATE OR REPLACE FUNCTION paygate.accept_lane_fence(p_lane text, p_by text) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    found_id bigint;
    evidence jsonb;
    accepted bigint;
BEGIN
    UPDATE paygate.findings SET resolved_at = now(), resolved_by = p_by
    WHERE kind = 'lane_fence' AND subject = p_lane AND resolved_at IS NULL
    RETURNING id, details INTO found_id, evidence;
    IF found_id IS NULL THEN
        RAISE EXCEPTION 'lane % has no open lane_fence finding', p_lane USING ERRCODE = 'no_data_found';
    END IF;
    accepted := (evidence ->> 'chain_seq')::bigint;
    IF accepted IS NULL THEN
        RAISE EXCEPTION 'lane_fence finding % records no chain_seq', found_id;
    END IF;
    UPDATE paygate.lanes SET accepted_seq = greatest(accepted_seq, accepted) WHERE address = p_lane;
    INSERT INTO paygate.audit_log (actor, action, target, details)
    VALUES (p_by, 'lane.fence_resolved', p_lane, jsonb_build_object('finding_id', found_id, 'accepted_seq', accepted));
    RETURN accepted;
END
$$;
