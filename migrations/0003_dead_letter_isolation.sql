-- Dead letters keep a tenant's refused turns, text included: isolate them below the application
-- like every other table with a tenant_id. Workers record letters of any tenant (or of none, for
-- a message without a valid tenant id), so inserting is open; reading is scoped to the
-- transaction's tenant. Operators read the table as its owner (a superuser bypasses the policy).

ALTER TABLE dead_letters ENABLE ROW LEVEL SECURITY;
ALTER TABLE dead_letters FORCE ROW LEVEL SECURITY;

CREATE POLICY dead_letters_record ON dead_letters
    FOR INSERT
    WITH CHECK (true);

CREATE POLICY tenant_isolation ON dead_letters
    FOR SELECT
    USING (tenant_id = current_setting('mnemos.tenant_id', true));
