"""How benchmark results name the files they read: models and data without a machine's absolute path."""

from __future__ import annotations

from pathlib import Path

__all__ = ["display_path"]


def display_path(path: Path) -> str:
    """``path`` relative to the working directory when it lies below it, else its last two parts:
    results name models and data without a machine's absolute path."""
    resolved = path.resolve()
    try:
        return str(resolved.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(Path(*resolved.parts[-2:]))
