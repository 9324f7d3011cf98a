-- A re-added turn id keeps its tombstone (docs/architecture.md "Forget", "Tombstones").
--
-- Until now an explicit re-add (readd) deleted the turn id's tombstone. A message of that turn id
-- published before the forget but read after the re-add (a dead consumer left it pending) then met
-- no tombstone: it was stored as a conflict, or a malformed one kept as a dead letter, with the text
-- the forget erased. The tombstone now stays, marked readded: messages published before the forget
-- are still dropped, later ones are kept as if there were no tombstone. A later forget of the turn
-- id moves the position forward and clears the mark.

ALTER TABLE tombstones ADD COLUMN readded boolean NOT NULL DEFAULT false;
