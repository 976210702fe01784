-- Why an idempotency key (or job key) is unacceptable, or NULL. Keys are opaque, but they are
-- printed by operator commands and logged: control characters, invisible and bidirectional
-- formatting characters (two keys that look identical, a key that reorders a log line) and
-- noncharacters are refused.
CREATE OR REPLACE FUNCTION paygate.admission_key_problem(p_key text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN p_key IS NULL OR length(p_key) NOT BETWEEN 1 AND 255 THEN 'must be 1..255 characters'
        WHEN p_key ~ '[\u0001-\u001f\u007f-\u009f]' THEN 'must be 1..255 characters without control characters'
        WHEN p_key ~ '[\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff\ufff9-\ufffb]'
            THEN 'must not contain invisible or bidirectional formatting characters'
        WHEN p_key ~ '[\ufdd0-\ufdef\ufffe\uffff]' THEN 'must not contain Unicode noncharacters'
    END
$$;
