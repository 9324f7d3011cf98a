"""``mnemos bench scale``: a large tenant, many tenants and shards through the service; the shard simulation."""
