-- A per-tenant suppression state version, so a retrieval can say which suppression state it read.
-- The suppression worker bumps tenants.suppression_version in the transaction that applies (or
-- buffers) an outcome and records the version that outcome produced in its ledger row; the query
-- worker reads the version in the snapshot it reads the scores and centroids from and returns it.
-- Replaying the ledger in version order rebuilds exactly the state a retrieval saw.

ALTER TABLE tenants ADD COLUMN suppression_version bigint NOT NULL DEFAULT 0;
ALTER TABLE applied_outcomes ADD COLUMN suppression_version bigint;  -- NULL: applied before this migration
CREATE UNIQUE INDEX applied_outcomes_tenant_version ON applied_outcomes (tenant_id, suppression_version);
