"""The query worker: retrieval and catalog jobs, wire conversion, packets, tenant indexes."""
