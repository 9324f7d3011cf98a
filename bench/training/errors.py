"""The typed error of reranker training."""

from __future__ import annotations


class TrainingDataError(ValueError):
    """Raised when training input is unusable: a malformed pairs file, an unknown or empty
    conversation selection, a bad fold spec, or no positive pairs at all.

    ``source`` names the file or selection at fault.
    """

    def __init__(self, source: str, problem: str) -> None:
        self.source = source
        self.problem = problem
        super().__init__(f"{source}: {problem}")
