-- The tables that grow with a tenant's turns and retrievals, partitioned by hash of tenant_id into
-- 16 partitions (docs/scaling.md "Postgres: partitioned by tenant"): entries, suppression,
-- query_buffer and applied_outcomes. Every key and unique constraint of a partitioned table holds
-- tenant_id, so entries is keyed (tenant_id, entry_id) and the references to an entry (an alias's
-- canonical, a suppression score) carry the tenant too: an alias or a score can no longer point at
-- another tenant's entry, even by a bug. entry_id stays unique across the deployment (one sequence).
-- The rows are copied; the service's statements do not change. Row-level security is forced on
-- each parent (what the service queries) and on each partition (a direct read of a partition is
-- scoped the same way); mnemos_app is granted the parents only. Grants to other roles on the old
-- tables (an operator's reporting role, say) go with them: grant them again on the new tables.

ALTER TABLE entries NO FORCE ROW LEVEL SECURITY;          -- the migrator may be the owner, not a superuser
ALTER TABLE suppression NO FORCE ROW LEVEL SECURITY;
ALTER TABLE query_buffer NO FORCE ROW LEVEL SECURITY;
ALTER TABLE applied_outcomes NO FORCE ROW LEVEL SECURITY;

-- 1. the unpartitioned tables step aside (their index names are schema-wide)
ALTER TABLE suppression RENAME TO suppression_unpartitioned;
ALTER INDEX suppression_pkey RENAME TO suppression_unpartitioned_pkey;
ALTER INDEX suppression_tenant_cluster RENAME TO suppression_unpartitioned_tenant_cluster;
ALTER TABLE entries RENAME TO entries_unpartitioned;
ALTER INDEX entries_pkey RENAME TO entries_unpartitioned_pkey;
ALTER INDEX entries_tenant_entry RENAME TO entries_unpartitioned_tenant_entry;
ALTER INDEX entries_tenant_turn RENAME TO entries_unpartitioned_tenant_turn;
ALTER TABLE query_buffer RENAME TO query_buffer_unpartitioned;
ALTER INDEX query_buffer_pkey RENAME TO query_buffer_unpartitioned_pkey;
ALTER TABLE applied_outcomes RENAME TO applied_outcomes_unpartitioned;
ALTER INDEX applied_outcomes_pkey RENAME TO applied_outcomes_unpartitioned_pkey;
ALTER INDEX applied_outcomes_tenant_version RENAME TO applied_outcomes_unpartitioned_tenant_version;

-- 2. the partitioned tables, with the same columns
CREATE TABLE entries (
    entry_id           bigint NOT NULL DEFAULT nextval('entries_entry_id_seq'),
    tenant_id          text NOT NULL,
    turn_id            text NOT NULL,
    session_id         text NOT NULL,
    role               text NOT NULL,
    text               text NOT NULL,
    occurred_at        timestamptz NOT NULL,
    embedding          bytea NOT NULL,
    canonical_entry_id bigint,                              -- NULL: canonical; else alias of that entry
    metadata           jsonb NOT NULL DEFAULT '{}'::jsonb,
    encoder_truncated  boolean NOT NULL DEFAULT false,
    stream_id          text,
    created_at         timestamptz NOT NULL DEFAULT now(),
    reindex_embedding  bytea,
    reindex_rendering  integer,
    reindex_truncated  boolean,
    CONSTRAINT entries_pkey PRIMARY KEY (tenant_id, entry_id),
    CONSTRAINT entries_tenant_turn UNIQUE (tenant_id, turn_id),
    CONSTRAINT entries_tenant_id_fkey FOREIGN KEY (tenant_id) REFERENCES tenants (tenant_id),
    CONSTRAINT entries_canonical FOREIGN KEY (tenant_id, canonical_entry_id) REFERENCES entries (tenant_id, entry_id)
) PARTITION BY HASH (tenant_id);

CREATE TABLE suppression (
    tenant_id  text NOT NULL,
    entry_id   bigint NOT NULL,
    cluster    integer NOT NULL,
    score      double precision NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT suppression_pkey PRIMARY KEY (tenant_id, entry_id, cluster),
    CONSTRAINT suppression_entry FOREIGN KEY (tenant_id, entry_id) REFERENCES entries (tenant_id, entry_id)
) PARTITION BY HASH (tenant_id);
CREATE INDEX suppression_tenant_cluster ON suppression (tenant_id, cluster);

CREATE TABLE query_buffer (
    tenant_id  text NOT NULL,
    seq        bigint NOT NULL DEFAULT nextval('query_buffer_seq_seq'),
    outcome_id text NOT NULL,
    embedding  bytea NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT query_buffer_pkey PRIMARY KEY (tenant_id, seq)
) PARTITION BY HASH (tenant_id);

CREATE TABLE applied_outcomes (
    tenant_id           text NOT NULL,
    outcome_id          text NOT NULL,
    cluster             integer,
    deltas              jsonb NOT NULL,
    stream_id           text,
    applied_at          timestamptz NOT NULL DEFAULT now(),
    suppression_version bigint,
    CONSTRAINT applied_outcomes_pkey PRIMARY KEY (tenant_id, outcome_id)
) PARTITION BY HASH (tenant_id);
CREATE UNIQUE INDEX applied_outcomes_tenant_version ON applied_outcomes (tenant_id, suppression_version);

DO $$
DECLARE
    parent text;
    part text;
BEGIN
    FOREACH parent IN ARRAY ARRAY['entries', 'suppression', 'query_buffer', 'applied_outcomes'] LOOP
        FOR remainder IN 0..15 LOOP
            part := format('%s_p%s', parent, lpad(remainder::text, 2, '0'));
            EXECUTE format('CREATE TABLE %I PARTITION OF %I FOR VALUES WITH (MODULUS 16, REMAINDER %s)',
                           part, parent, remainder);
            EXECUTE format('ALTER TABLE %I ENABLE ROW LEVEL SECURITY', part);
            EXECUTE format('ALTER TABLE %I FORCE ROW LEVEL SECURITY', part);
            EXECUTE format('CREATE POLICY tenant_isolation ON %I'
                           ' USING (tenant_id = current_setting(''mnemos.tenant_id'', true))'
                           ' WITH CHECK (tenant_id = current_setting(''mnemos.tenant_id'', true))', part);
        END LOOP;
        EXECUTE format('ALTER TABLE %I ENABLE ROW LEVEL SECURITY', parent);
        EXECUTE format('ALTER TABLE %I FORCE ROW LEVEL SECURITY', parent);
        EXECUTE format('CREATE POLICY tenant_isolation ON %I'
                       ' USING (tenant_id = current_setting(''mnemos.tenant_id'', true))'
                       ' WITH CHECK (tenant_id = current_setting(''mnemos.tenant_id'', true))', parent);
        EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON %I TO mnemos_app', parent);
    END LOOP;
END
$$;

-- 3. the rows move, with the new parents' policies lifted for the owner while it copies (a routed
-- insert checks the parent's policies; the owner has no mnemos.tenant_id)
ALTER TABLE entries NO FORCE ROW LEVEL SECURITY;
ALTER TABLE suppression NO FORCE ROW LEVEL SECURITY;
ALTER TABLE query_buffer NO FORCE ROW LEVEL SECURITY;
ALTER TABLE applied_outcomes NO FORCE ROW LEVEL SECURITY;
-- the rows (canonicals before their aliases is not needed: the check runs at the statement's end)
INSERT INTO entries (entry_id, tenant_id, turn_id, session_id, role, text, occurred_at, embedding,
                     canonical_entry_id, metadata, encoder_truncated, stream_id, created_at,
                     reindex_embedding, reindex_rendering, reindex_truncated)
SELECT entry_id, tenant_id, turn_id, session_id, role, text, occurred_at, embedding,
       canonical_entry_id, metadata, encoder_truncated, stream_id, created_at,
       reindex_embedding, reindex_rendering, reindex_truncated
  FROM entries_unpartitioned;
INSERT INTO suppression (tenant_id, entry_id, cluster, score, updated_at)
SELECT tenant_id, entry_id, cluster, score, updated_at FROM suppression_unpartitioned;
INSERT INTO query_buffer (tenant_id, seq, outcome_id, embedding, created_at)
SELECT tenant_id, seq, outcome_id, embedding, created_at FROM query_buffer_unpartitioned;
INSERT INTO applied_outcomes (tenant_id, outcome_id, cluster, deltas, stream_id, applied_at, suppression_version)
SELECT tenant_id, outcome_id, cluster, deltas, stream_id, applied_at, suppression_version
  FROM applied_outcomes_unpartitioned;

ALTER TABLE entries FORCE ROW LEVEL SECURITY;
ALTER TABLE suppression FORCE ROW LEVEL SECURITY;
ALTER TABLE query_buffer FORCE ROW LEVEL SECURITY;
ALTER TABLE applied_outcomes FORCE ROW LEVEL SECURITY;

-- 4. the sequences pass to the new tables, the old ones go
ALTER SEQUENCE entries_entry_id_seq OWNED BY entries.entry_id;
ALTER SEQUENCE query_buffer_seq_seq OWNED BY query_buffer.seq;
DROP TABLE suppression_unpartitioned;
DROP TABLE entries_unpartitioned;
DROP TABLE query_buffer_unpartitioned;
DROP TABLE applied_outcomes_unpartitioned;

-- 5. statistics for the planner (autovacuum analyzes the partitions, never a partitioned parent)
ANALYZE entries, suppression, query_buffer, applied_outcomes;
