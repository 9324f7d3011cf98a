"""The exit codes every ``mnemos`` command ends with (:mod:`workers.cli`, :mod:`workers.ops.health`); 0 is success."""

from __future__ import annotations

EXIT_FAILED = 1  # a service failed or refused: Postgres/Redis unreachable, no query worker, a failed retrieval
EXIT_MISCONFIGURED = 2  # an operator must act first: settings, a missing/unmigrated database, versions, models
