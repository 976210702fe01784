-- Admission of a bot job (a permissionless contract call the product queues), called by the API
-- service. Dedup per job key: the same key with the same call returns the first job; the same key
-- with a different call is refused (23505). Refused while admission is halted (55000) or when the
-- function is not on the bot-job allow-list (42501): a bot job spends the gateway's fees too, and
-- a function safe to relay with a user's signature is not therefore safe to call with none, so
-- this reads bot_job_allowlist, never relay_allowlist.
-- Admission hardening (all admit_* functions and create_subscription): what a hostile or broken
-- API caller can send is refused with a clear message and a stable SQLSTATE before anything is
-- written, never with a raw overflow, check-constraint or datetime error:
--   22023 invalid_parameter_value: every malformed argument (the message names the argument);
--   23505 key reused for another request, 55000 admission halted, 42501 not allow-listed,
--   PG402 no funds / no fee budget.
-- What SQL cannot see (signatures, the network an entry was signed for, the USDC contract a
-- deposit names) is checked by the workers, which quarantine the row with its reason. NUL bytes
-- never reach these functions: PostgreSQL text cannot hold them (the server answers 22021 first).
CREATE OR REPLACE FUNCTION paygate.admit_bot_job(
    p_job_key text, p_contract text, p_function text, p_args_xdr text, p_max_attempts integer DEFAULT NULL
) RETURNS TABLE (bot_job_id bigint, replayed boolean)
LANGUAGE plpgsql AS $$
DECLARE
    v_request_hash bytea := sha256(convert_to(concat_ws('|', p_contract, p_function, p_args_xdr), 'UTF8'));
    v_existing paygate.bot_jobs%ROWTYPE;
    v_args bytea;
    v_id bigint;
    v_problem text;
BEGIN
    v_problem := paygate.admission_key_problem(p_job_key);
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION 'admit_bot_job: job key %', v_problem USING ERRCODE = '22023';
    END IF;
    IF NOT paygate.strkey_is_valid(p_contract, 'C') THEN
        RAISE EXCEPTION 'admit_bot_job: contract is not a contract address (C..., 56 characters, valid checksum)'
            USING ERRCODE = '22023';
    END IF;
    IF p_function IS NULL OR p_function !~ '^[A-Za-z0-9_]{1,32}$' THEN
        RAISE EXCEPTION 'admit_bot_job: function is not a contract function name (1..32 of A-Z a-z 0-9 _)'
            USING ERRCODE = '22023';
    END IF;
    IF p_args_xdr IS NULL OR length(p_args_xdr) > 65536 OR p_args_xdr !~ '^[A-Za-z0-9+/]+={0,2}$'
       OR length(p_args_xdr) % 4 <> 0 THEN
        RAISE EXCEPTION 'admit_bot_job: args_xdr is not base64 XDR (at most 65536 characters)' USING ERRCODE = '22023';
    END IF;
    v_args := decode(p_args_xdr, 'base64');
    IF length(v_args) < 8 OR substring(v_args FROM 1 FOR 8) <> '\x0000001000000001'::bytea THEN
        RAISE EXCEPTION 'admit_bot_job: args_xdr must be an SCVal vector of the call''s arguments'
            USING ERRCODE = '22023';
    END IF;
    IF p_max_attempts IS NOT NULL AND p_max_attempts <= 0 THEN
        RAISE EXCEPTION 'admit_bot_job: max_attempts must be positive' USING ERRCODE = '22023';
    END IF;

    INSERT INTO paygate.bot_jobs (job_key, request_hash, contract, function, args_xdr, max_attempts)
    SELECT p_job_key, v_request_hash, p_contract, p_function, p_args_xdr, p_max_attempts
    WHERE NOT EXISTS (SELECT 1 FROM paygate.halts)
      AND EXISTS (SELECT 1 FROM paygate.bot_job_allowlist a
                  WHERE a.contract = p_contract AND a.function = p_function AND a.enabled)
    ON CONFLICT (job_key) DO NOTHING
    RETURNING id INTO v_id;
    IF v_id IS NOT NULL THEN
        RETURN QUERY SELECT v_id, false;
        RETURN;
    END IF;
    SELECT * INTO v_existing FROM paygate.bot_jobs WHERE job_key = p_job_key;
    IF FOUND THEN
        IF v_existing.request_hash <> v_request_hash THEN
            RAISE EXCEPTION 'admit_bot_job: job key % was used for a different call', p_job_key
                USING ERRCODE = '23505';
        END IF;
        RETURN QUERY SELECT v_existing.id, true;
        RETURN;
    END IF;
    IF EXISTS (SELECT 1 FROM paygate.halts) THEN
        RAISE EXCEPTION 'admit_bot_job: admission is halted (%)',
            (SELECT string_agg(kind || ': ' || reason, '; ' ORDER BY kind) FROM paygate.halts)
            USING ERRCODE = '55000';
    END IF;
    RAISE EXCEPTION 'admit_bot_job: %.% is not on the bot-job allow-list', p_contract, p_function
        USING ERRCODE = '42501';
END
$$;
