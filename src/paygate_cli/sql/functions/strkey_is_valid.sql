-- A StrKey address of one kind: 'G' (ed25519 account, version byte 6 << 3) or 'C' (contract,
-- 2 << 3), base32 of version byte + 32-byte payload + CRC16-XModem (little-endian). The pattern
-- alone lets a one-character typo through (it would be admitted and fail on chain, or worse,
-- sit in accounts for ever): the checksum catches it here.
CREATE OR REPLACE FUNCTION paygate.strkey_is_valid(p_address text, p_kind text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    alphabet constant text := 'ABCDEFGHIJKLMNOPQRSTUVWXYZ234567';
    raw bytea := decode(repeat('00', 35), 'hex');
    acc bigint;
    crc integer := 0;
BEGIN
    IF p_address IS NULL OR p_kind NOT IN ('G', 'C') OR p_address !~ ('^' || p_kind || '[A-Z2-7]{55}$') THEN
        RETURN false;
    END IF;
    FOR g IN 0..6 LOOP   -- 8 base32 characters = 5 bytes
        acc := 0;
        FOR i IN 1..8 LOOP
            acc := acc * 32 + (strpos(alphabet, substr(p_address, g * 8 + i, 1)) - 1);
        END LOOP;
        FOR i IN 0..4 LOOP
            raw := set_byte(raw, g * 5 + i, ((acc >> (8 * (4 - i))) & 255)::integer);
        END LOOP;
    END LOOP;
    -- (no CASE inside IF: PL/pgSQL ends an IF condition at the first THEN)
    IF get_byte(raw, 0) <> (2 + 4 * (p_kind = 'G')::integer) << 3 THEN
        RETURN false;
    END IF;
    FOR i IN 0..32 LOOP
        crc := crc # (get_byte(raw, i) << 8);
        FOR k IN 1..8 LOOP
            crc := CASE WHEN crc & 32768 <> 0 THEN ((crc << 1) # 4129) & 65535 ELSE (crc << 1) & 65535 END;
        END LOOP;
    END LOOP;
    RETURN crc = get_byte(raw, 33) + (get_byte(raw, 34) << 8);
END
$$;
