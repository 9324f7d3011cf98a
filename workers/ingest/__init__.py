"""The ingest side: the ingest worker, forget in Postgres and Redis, reindex."""
