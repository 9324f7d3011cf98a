-- Tenant isolation below the application: every tenant table only shows rows whose tenant_id
-- equals the transaction's `mnemos.tenant_id` setting (set by the store with set_config(..., true)).
-- FORCE applies the policies to the table owner as well; superusers still bypass them, so the
-- service works as the NOLOGIN role mnemos_app (SET ROLE, or a login role that is a member of it).

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'mnemos_app') THEN
        CREATE ROLE mnemos_app NOLOGIN NOSUPERUSER NOBYPASSRLS;
    END IF;
EXCEPTION WHEN duplicate_object OR unique_violation THEN
    NULL;  -- another database's migrator created it at the same moment
END
$$;

GRANT USAGE ON SCHEMA public TO mnemos_app;
GRANT SELECT, INSERT, UPDATE, DELETE
    ON tenants, entries, suppression, centroids, query_buffer, applied_outcomes, dead_letters
    TO mnemos_app;
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO mnemos_app;

ALTER TABLE tenants ENABLE ROW LEVEL SECURITY;
ALTER TABLE tenants FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON tenants
    USING (tenant_id = current_setting('mnemos.tenant_id', true))
    WITH CHECK (tenant_id = current_setting('mnemos.tenant_id', true));

ALTER TABLE entries ENABLE ROW LEVEL SECURITY;
ALTER TABLE entries FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON entries
    USING (tenant_id = current_setting('mnemos.tenant_id', true))
    WITH CHECK (tenant_id = current_setting('mnemos.tenant_id', true));

ALTER TABLE suppression ENABLE ROW LEVEL SECURITY;
ALTER TABLE suppression FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON suppression
    USING (tenant_id = current_setting('mnemos.tenant_id', true))
    WITH CHECK (tenant_id = current_setting('mnemos.tenant_id', true));

ALTER TABLE centroids ENABLE ROW LEVEL SECURITY;
ALTER TABLE centroids FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON centroids
    USING (tenant_id = current_setting('mnemos.tenant_id', true))
    WITH CHECK (tenant_id = current_setting('mnemos.tenant_id', true));

ALTER TABLE query_buffer ENABLE ROW LEVEL SECURITY;
ALTER TABLE query_buffer FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON query_buffer
    USING (tenant_id = current_setting('mnemos.tenant_id', true))
    WITH CHECK (tenant_id = current_setting('mnemos.tenant_id', true));

ALTER TABLE applied_outcomes ENABLE ROW LEVEL SECURITY;
ALTER TABLE applied_outcomes FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON applied_outcomes
    USING (tenant_id = current_setting('mnemos.tenant_id', true))
    WITH CHECK (tenant_id = current_setting('mnemos.tenant_id', true));

-- dead_letters keeps rows of messages that had no valid tenant; it is an operator table
-- (the service only inserts into it) and carries no policy.
