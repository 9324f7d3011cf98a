"""Markdown tables the bench commands print and append to result files.

Two small rules every table follows: a label that holds ``|`` cannot split a cell, and a table
appended to an existing file starts after a blank line, so the file stays valid markdown.
"""

from __future__ import annotations

from pathlib import Path


class MarkdownTargetError(ValueError):
    """The file a table should be appended to cannot be written (its directory is missing)."""


def escape_cell(text: str) -> str:
    """``text`` with every ``|`` escaped as ``\\|``, safe inside a markdown table cell."""
    return text.replace("|", "\\|")


def check_target(path: Path) -> None:
    """Raise :class:`MarkdownTargetError` before any work when ``path``'s directory does not exist."""
    if not path.parent.is_dir():
        raise MarkdownTargetError(f"--markdown {path}: no directory {path.parent} to write it in")


def append_markdown(path: Path, text: str) -> None:
    """Append ``text`` to ``path`` (created if missing), after a blank line when the file has content.

    Raises:
        OSError: the file cannot be read or written.
    """
    before = path.read_text(encoding="utf-8") if path.exists() else ""
    gap = "" if not before or before.endswith("\n\n") else "\n"
    path.write_text(before + gap + text, encoding="utf-8")
