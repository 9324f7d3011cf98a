-- Which rendering and which encoder dimension a tenant's stored embeddings were made with, so that
-- embeddings of one version are never mixed with another's (workers check it at start and per
-- tenant; `mnemos reindex` moves a tenant to the current version).
--
-- tenants.rendering_version: the rendering (mnemos.rendering.Rendering) of every embedding of the
--     tenant. No default: every writer names the rendering it embedded with.
-- tenants.embedding_dim: floats per stored embedding; NULL while the tenant has no embedding.
-- entries.reindex_*: what `mnemos reindex` needs to be resumable: an embedding made for
--     reindex_rendering (its dimension is its length / 4), with its truncation flag, waiting to be
--     swapped into `embedding` when the whole tenant is done. NULL outside a reindex.
--
-- Existing tenants were embedded from the raw text (rendering 0); their dimension is read from the
-- byte length of a stored embedding.

ALTER TABLE tenants ADD COLUMN rendering_version integer NOT NULL DEFAULT 0;
ALTER TABLE tenants ALTER COLUMN rendering_version DROP DEFAULT;
ALTER TABLE tenants ADD COLUMN embedding_dim integer;

ALTER TABLE entries
    ADD COLUMN reindex_embedding bytea,
    ADD COLUMN reindex_rendering integer,
    ADD COLUMN reindex_truncated boolean;

-- The backfill must see every tenant: row-level security is forced on the table owner too, so it
-- is lifted for this transaction only (a superuser bypasses it anyway).
ALTER TABLE tenants NO FORCE ROW LEVEL SECURITY;
ALTER TABLE entries NO FORCE ROW LEVEL SECURITY;
UPDATE tenants AS t
   SET embedding_dim = e.dim
  FROM (SELECT DISTINCT ON (tenant_id) tenant_id, octet_length(embedding) / 4 AS dim
          FROM entries ORDER BY tenant_id, entry_id) AS e
 WHERE e.tenant_id = t.tenant_id;
ALTER TABLE tenants FORCE ROW LEVEL SECURITY;
ALTER TABLE entries FORCE ROW LEVEL SECURITY;

-- Start-up checks, `mnemos health` and `mnemos reindex` compare the versions of every tenant. The
-- service's role sees one tenant per transaction, so this function (running as its owner, the
-- migrating role) lists the versions of all tenants and nothing else; the owner gets a read-only
-- policy on tenants for it (a superuser needs none).
DO $$
BEGIN
    EXECUTE format('CREATE POLICY owner_reads_versions ON tenants FOR SELECT TO %I USING (true)', current_user);
END
$$;

CREATE FUNCTION mnemos_tenant_versions()
    RETURNS TABLE (tenant_id text, rendering_version integer, embedding_dim integer)
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path = pg_catalog, public
AS $$
    SELECT tenant_id, rendering_version, embedding_dim FROM public.tenants ORDER BY tenant_id
$$;
REVOKE ALL ON FUNCTION mnemos_tenant_versions() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION mnemos_tenant_versions() TO mnemos_app;

-- Workers check at start that every migration is applied, as the service's role.
GRANT SELECT ON schema_migrations TO mnemos_app;
