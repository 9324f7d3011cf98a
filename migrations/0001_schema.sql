-- Mnemos schema v1: the source of truth for entries, suppression scores, centroids,
-- the bootstrap query buffer, the applied-outcomes ledger and dead letters.
-- Embeddings are float32 little-endian bytes of L2-normalized vectors.

CREATE TABLE tenants (
    tenant_id      text PRIMARY KEY,
    memory_version bigint NOT NULL DEFAULT 0,          -- bumped by every ingest commit that wrote rows
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE entries (
    entry_id           bigserial PRIMARY KEY,
    tenant_id          text NOT NULL REFERENCES tenants (tenant_id),
    turn_id            text NOT NULL,
    session_id         text NOT NULL,
    role               text NOT NULL,
    text               text NOT NULL,                  -- full text, never truncated
    occurred_at        timestamptz NOT NULL,
    embedding          bytea NOT NULL,
    canonical_entry_id bigint REFERENCES entries (entry_id),  -- NULL: canonical; else alias of that entry
    metadata           jsonb NOT NULL DEFAULT '{}'::jsonb,
    encoder_truncated  boolean NOT NULL DEFAULT false,  -- the bi-encoder saw only a prefix of the text
    stream_id          text,                            -- id of the stream message that carried the turn
    created_at         timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT entries_tenant_turn UNIQUE (tenant_id, turn_id)
);
CREATE INDEX entries_tenant_entry ON entries (tenant_id, entry_id);

CREATE TABLE suppression (
    tenant_id  text NOT NULL,
    entry_id   bigint NOT NULL REFERENCES entries (entry_id),
    cluster    integer NOT NULL,
    score      double precision NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, entry_id, cluster)
);
CREATE INDEX suppression_tenant_cluster ON suppression (tenant_id, cluster);

CREATE TABLE centroids (
    tenant_id text PRIMARY KEY REFERENCES tenants (tenant_id),
    k         integer NOT NULL,
    dim       integer NOT NULL,
    vectors   bytea NOT NULL,                           -- (k, dim) float32, row-major
    n_queries integer NOT NULL,                         -- bootstrap queries the k-means saw
    frozen_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE query_buffer (
    tenant_id  text NOT NULL,
    seq        bigserial,
    outcome_id text NOT NULL,
    embedding  bytea NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, seq)
);

CREATE TABLE applied_outcomes (
    tenant_id  text NOT NULL,
    outcome_id text NOT NULL,
    cluster    integer,                                 -- NULL: before bootstrap, buffered only
    deltas     jsonb NOT NULL,                          -- [[entry_id, cluster, delta], ...]
    stream_id  text,
    applied_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, outcome_id)
);

CREATE TABLE dead_letters (
    dead_letter_id bigserial PRIMARY KEY,
    stream         text NOT NULL,
    stream_id      text NOT NULL,
    reason         text NOT NULL,
    detail         text NOT NULL DEFAULT '',
    tenant_id      text,                                -- NULL when the message had no valid tenant
    turn_id        text,
    payload        jsonb NOT NULL DEFAULT '{}'::jsonb,
    created_at     timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT dead_letters_message UNIQUE (stream, stream_id)
);
