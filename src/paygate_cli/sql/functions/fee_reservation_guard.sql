-- before the schema: the fee_reservations trigger uses it.
-- A fee reservation is closed exactly once (reserved -> settled | released) and its amount never
-- changes: with the table's CHECKs, "both" and "twice" are impossible, not merely unlikely.
CREATE OR REPLACE FUNCTION paygate.fee_reservation_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.status <> 'reserved' THEN
        RAISE EXCEPTION 'fee reservation of relay % is closed (%); it never changes', OLD.relay_id, OLD.status
            USING ERRCODE = 'check_violation';
    END IF;
    IF NEW.amount <> OLD.amount THEN
        RAISE EXCEPTION 'fee reservation of relay %: the reserved amount never changes', OLD.relay_id
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END
$$;
