-- The read-only role for on-call engineers: `status`, `reconcile-report` and `nonce-inspect` work as
-- it; SELECT only, on the tables paygate_cli/db/privileges.py marks readable (never the webhook
-- secrets), and no write anywhere, audit_log included. Created here if missing; grants are applied
-- by `paygate migrate --roles` right after this file.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = {role_literal}) THEN
        CREATE ROLE {role} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS;
    END IF;
END
$$;
