-- before the schema: the observer_cursor trigger uses it.
-- The cursor only moves forward: the zero-padded id orders lexicographically like (ledger, index).
CREATE OR REPLACE FUNCTION paygate.observer_cursor_forward() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.cursor < OLD.cursor THEN
        RAISE EXCEPTION 'observer cursor may not move backwards (% -> %)', OLD.cursor, NEW.cursor
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END
$$;
