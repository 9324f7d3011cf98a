-- Turn ids a session or tenant forget erased (docs/architecture.md "Forget", "Tombstones").
--
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
