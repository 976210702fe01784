-- Was a unit admitted before this database was last found gone back in time (a `restore` halt,
-- sql/0004_restore_gate.sql; audited as restore_halt)? Then a transaction of ours that the restore
-- lost may have used its authorisation. While the authorisation lives, the chain shows that (its
-- nonce entry, and the transaction that wrote it); once it expired the host may drop the nonce entry,
-- and "never used" can no longer be read from the chain: such a unit is a human's, never `expired`.
CREATE OR REPLACE FUNCTION paygate.admitted_before_restore(p_admitted_at timestamptz) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM paygate.audit_log WHERE action = 'restore_halt' AND at > p_admitted_at)
$$;
