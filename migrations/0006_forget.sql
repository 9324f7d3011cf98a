-- Forget (docs/architecture.md "Forget"): erasing turns, a session or a whole tenant on request.
--
-- tenants.forget_version: bumped (with memory_version) by every applied forget event. Entry ids of a
--     tenant only grow, so a query or ingest worker that extends its in-memory state by "ids above the
--     last one seen" cannot notice a deletion; a changed forget_version tells it to rebuild instead.
-- tombstones: what a forget leaves behind, ids only (never text): the scope it covered (the tenant,
--     a session or one turn id) and the stream id of the forget event (ms, seq). A turn message of
--     that scope published before the event is dropped; a turn with a tombstoned turn id published
--     after it is dropped too, unless it is an explicit re-add (which removes the tombstone).
-- dead_letters: a forget deletes the tenant's refused messages, text included; the service's role
--     may now delete (never read) the letters of the transaction's tenant.

ALTER TABLE tenants ADD COLUMN forget_version bigint NOT NULL DEFAULT 0;

CREATE TABLE tombstones (
    tenant_id    text NOT NULL,
    scope        text NOT NULL CHECK (scope IN ('tenant', 'session', 'turn')),
    key          text NOT NULL,                       -- '' for the tenant, else the session or turn id
    stream_ms    bigint NOT NULL,                     -- stream id of the latest forget of this scope
    stream_seq   bigint NOT NULL,
    forgotten_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, scope, key)
);

GRANT SELECT, INSERT, UPDATE, DELETE ON tombstones TO mnemos_app;
ALTER TABLE tombstones ENABLE ROW LEVEL SECURITY;
ALTER TABLE tombstones FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON tombstones
    USING (tenant_id = current_setting('mnemos.tenant_id', true))
    WITH CHECK (tenant_id = current_setting('mnemos.tenant_id', true));

CREATE POLICY dead_letters_forget ON dead_letters
    FOR DELETE
    USING (tenant_id = current_setting('mnemos.tenant_id', true));
