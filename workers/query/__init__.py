"""The query worker: retrieval and catalog jobs, packets, tenant indexes."""
