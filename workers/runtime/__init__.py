"""What every process runs on: the stream loop, the Redis client, settings checks, heartbeats, liveness, metrics, models, embedded servers, dead letters, wire conversions, errors and exit codes."""
