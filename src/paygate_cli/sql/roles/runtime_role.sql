-- The runtime role (every worker's run-tick and the operator's write commands): created here if
-- missing; its table grants come from the table of decisions in paygate_cli/db/privileges.py, applied
-- by `paygate migrate --roles` right after this file. No DDL, no TRUNCATE, nothing by wildcard.
-- Rerun `paygate migrate --roles` after every migration. {role} is substituted as a quoted identifier.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = {role_literal}) THEN
        CREATE ROLE {role} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS;
    END IF;
END
$$;
