-- Consumers of one group read a tenant's messages out of stream order (docs/architecture.md
-- "Forget", "Tombstones"). Two order effects of forgets are fixed here.
--
-- 1. Turn ids a session or tenant forget erased.
-- Until now such a forget wrote a plain turn tombstone for every turn id it erased, at its own
-- stream position. A turn tombstone drops every message of its turn id published before it, in any
-- session. Consumers of one group run side by side, so a message published before the forget that
-- moved the turn id into another session (a replacement, a LangGraph store put) could be read after
-- the forget had erased the old value: it was dropped, and the new value was lost, though in
-- stream order the forget would not have covered it.
--
-- Such turn ids are now swept (scope 'swept'): a message of the turn id published after the sweep
-- is a retry and is dropped unless it is a re-add (readd_ms, readd_seq as for 'turn'); one
-- published before it is judged by its own session's and tenant's tombstones only. Turn tombstones
-- already written by earlier session and tenant forgets stay as they are (the older, stricter rule).

ALTER TABLE tombstones
    DROP CONSTRAINT tombstones_scope_check,
    ADD CONSTRAINT tombstones_scope_check CHECK (scope IN ('tenant', 'session', 'turn', 'replace', 'swept'));

-- 2. A forget of a turn id read after a plain retry of the erased value that was published after the
-- forget. In stream order the retry is dropped; read first, it was stored, and the forget (which
-- keeps a turn carried by a message after it) left the forgotten text stored. A turn-id forget now
-- erases every stored value of its turn ids, unless a re-add after the forget carried that value.
-- entries.readd_ms / readd_seq: the stream id of the latest re-add message (readd, or a
-- replacement) that carried the stored value, NULL when none did; a re-add that repeats the stored
-- value moves it forward. A session or tenant forget also keeps a value re-added after it.

ALTER TABLE entries ADD COLUMN readd_ms bigint, ADD COLUMN readd_seq bigint,
    ADD CONSTRAINT entries_readd_position CHECK ((readd_ms IS NULL) = (readd_seq IS NULL));
