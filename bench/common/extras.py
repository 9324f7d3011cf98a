"""The optional extras the benchmark part needs, checked without importing them."""

from __future__ import annotations

import importlib.util

__all__ = ["EXTRA_MODULES", "require_extra"]

EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "bench": ("matplotlib", "diskcache"),  # scipy too, but the core needs it (mnemos/bm25_index.py)
    "train": ("datasets", "accelerate"),
}
"""The import names of each optional extra's requirements in ``pyproject.toml`` (a test keeps them in step)."""


def require_extra(extra: str) -> None:
    """Raise :class:`ModuleNotFoundError` unless every module of ``extra`` (:data:`EXTRA_MODULES`) is installed.

    Only looks the modules up (``importlib.util.find_spec``); nothing is imported. The message names
    the missing modules and the ``pip install`` that brings them.
    """
    missing = [name for name in EXTRA_MODULES[extra] if importlib.util.find_spec(name) is None]
    if missing:
        raise ModuleNotFoundError(f"the {extra!r} extra is not installed (missing {', '.join(missing)}): "
                                  f"pip install 'mnemos[{extra}]'", name=missing[0])
