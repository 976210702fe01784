-- The runtime role: DML on operational tables, INSERT/SELECT only on audit_log, read-only
-- schema_migrations, no DDL. Rerun `paygate migrate --roles` after every migration so new
-- tables are granted too. {role} is substituted as a quoted identifier by paygate.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = {role_literal}) THEN
        CREATE ROLE {role} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION;
    END IF;
END
$$;

REVOKE ALL ON SCHEMA paygate FROM {role};
GRANT USAGE ON SCHEMA paygate TO {role};
REVOKE ALL ON ALL TABLES IN SCHEMA paygate FROM {role};
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA paygate TO {role};
REVOKE UPDATE, DELETE, TRUNCATE ON paygate.audit_log FROM {role};
REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON paygate.schema_migrations FROM {role};
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA paygate TO {role};
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA paygate TO {role};
