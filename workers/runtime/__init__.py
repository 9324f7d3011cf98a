"""What every process runs on: entry points, supervisor, stream loop, Redis client, settings checks, heartbeats, liveness, metrics, models, database checks, errors and exit codes."""
