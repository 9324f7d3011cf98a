-- Re-adds and replacements on tombstones (docs/architecture.md "Forget", "Tombstones").
--
-- Until now an explicit re-add (readd) deleted the turn id's tombstone. A message of that turn id
-- published before the forget, or between the forget and the re-add (a retry), but read after the
-- re-add (a dead consumer left it pending) then met no tombstone: it was stored as a conflict, or
-- a malformed one kept as a dead letter, with the text the forget erased. The tombstone now stays
-- and records the stream id of the earliest re-add applied since its forget (readd_ms, readd_seq):
-- messages published before the re-add stay dropped, the re-add and later ones are ordinary. A
-- later forget of the turn id moves the tombstone forward and drops a re-add position before it.
--
-- A replacement (readd = replace) records its position under its own scope, 'replace': older
-- messages of the turn id are dropped (a stale value never comes back, on redelivery or through a
-- tenant move), but it is no forget, so it never drops a refused message's dead letter.

ALTER TABLE tombstones ADD COLUMN readd_ms bigint, ADD COLUMN readd_seq bigint,
    ADD CONSTRAINT tombstones_readd_position CHECK ((readd_ms IS NULL) = (readd_seq IS NULL)),
    DROP CONSTRAINT tombstones_scope_check,
    ADD CONSTRAINT tombstones_scope_check CHECK (scope IN ('tenant', 'session', 'turn', 'replace'));
