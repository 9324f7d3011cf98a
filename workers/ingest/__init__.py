"""The ingest side: the ingest worker, dead letters, forget in Postgres and Redis, reindex."""
