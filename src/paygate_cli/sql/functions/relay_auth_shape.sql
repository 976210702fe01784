-- What SQL can prove about one SorobanAuthorizationEntry (base64 XDR) without an XDR library:
-- the credentials are ADDRESS (1) or ADDRESS_V2 (2) for an account or contract address, and the
-- nonce and signatureExpirationLedger that follow. Signature, network and invocation are checked
-- by the relay worker, which quarantines what this cannot see.
CREATE OR REPLACE FUNCTION paygate.relay_auth_shape(p_entry text, OUT nonce bigint, OUT expiration_ledger bigint)
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v bytea;
    v_cred integer;
    v_addr integer;
    v_off integer;  -- 0-based offset of the nonce
BEGIN
    IF p_entry IS NULL OR length(p_entry) > 16384 OR p_entry !~ '^[A-Za-z0-9+/]+={0,2}$'
       OR length(p_entry) % 4 <> 0 THEN
        RAISE EXCEPTION 'auth entry is not base64 XDR' USING ERRCODE = '22023';
    END IF;
    v := decode(p_entry, 'base64');
    IF length(v) < 16 THEN
        RAISE EXCEPTION 'auth entry is too short to be a SorobanAuthorizationEntry' USING ERRCODE = '22023';
    END IF;
    v_cred := ('x' || encode(substring(v FROM 1 FOR 4), 'hex'))::bit(32)::integer;
    IF v_cred = 0 THEN
        RAISE EXCEPTION 'auth entry has SOURCE_ACCOUNT credentials: it would authorise as the gateway''s own '
            'account; a relay carries the user''s ADDRESS credentials' USING ERRCODE = '22023';
    ELSIF v_cred NOT IN (1, 2) THEN
        RAISE EXCEPTION 'auth entry credentials must be ADDRESS or ADDRESS_V2 (type %)', v_cred
            USING ERRCODE = '22023';
    END IF;
    v_addr := ('x' || encode(substring(v FROM 5 FOR 4), 'hex'))::bit(32)::integer;
    IF v_addr = 0 THEN
        v_off := 4 + 4 + 4 + 32;   -- credentials type, address type, key type, ed25519 key
    ELSIF v_addr = 1 THEN
        v_off := 4 + 4 + 32;       -- credentials type, address type, contract hash
    ELSE
        RAISE EXCEPTION 'auth entry credentials must name an account or a contract (address type %)', v_addr
            USING ERRCODE = '22023';
    END IF;
    IF length(v) < v_off + 12 + 4 THEN
        RAISE EXCEPTION 'auth entry is truncated' USING ERRCODE = '22023';
    END IF;
    nonce := ('x' || encode(substring(v FROM v_off + 1 FOR 8), 'hex'))::bit(64)::bigint;
    expiration_ledger := ('x' || '00000000' || encode(substring(v FROM v_off + 9 FOR 4), 'hex'))::bit(64)::bigint;
    IF expiration_ledger <= 0 THEN
        RAISE EXCEPTION 'auth entry has no signature expiration ledger' USING ERRCODE = '22023';
    END IF;
END
$$;
