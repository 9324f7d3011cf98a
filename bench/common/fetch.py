"""``mnemos data fetch``: benchmark data sets downloaded from a pinned upstream commit, checked by sha256.

A :class:`RemoteFile` names one file at a fixed URL (a commit, never a branch) with its size and
sha256. :func:`fetch` streams it into a temporary file beside its final place, checks the size
and the digest, and only then renames it into the cache directory (``MNEMOS_DATA_DIR``): a
wrong or truncated download leaves nothing behind. :func:`locate_locomo` is the order ``make
run`` looks for LoCoMo in: the path it was given, the shared copy next to the repository, the
cached download, else a download.

LoCoMo (Maharana et al., ACL 2024) is CC BY-NC 4.0; it is downloaded on the user's machine, never
committed here.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import click

from bench.common.datasets import DatasetError

__all__ = ["LOCOMO", "SHARED_LOCOMO", "DataFetchError", "DataFolderError", "RemoteFile", "cached_file", "fetch", "locate_locomo"]

log = logging.getLogger(__name__)


class DataFetchError(DatasetError):
    """Raised when a data set cannot be downloaded (unreachable, HTTP error) or the download is not
    the pinned file (wrong size or sha256); nothing is cached then. ``url`` names the source."""

    def __init__(self, url: str, problem: str) -> None:
        self.url = url
        self.problem = problem
        super().__init__(f"{url}: {problem}")


class DataFolderError(DataFetchError):
    """Raised when the data folder (``MNEMOS_DATA_DIR``) cannot hold a download: a file stands at
    its path, or it cannot be created or written. A setting to change, not a failed download."""

    def __init__(self, url: str, folder: Path, exc: OSError) -> None:
        super().__init__(url, f"cannot download into {folder} (MNEMOS_DATA_DIR): {exc.strerror or exc}")


@dataclass(frozen=True)
class RemoteFile:
    """One pinned file: ``url`` (at a fixed commit), its ``sha256`` (hex) and ``size_bytes``; cached as ``name``."""

    name: str
    url: str
    sha256: str
    size_bytes: int


LOCOMO = RemoteFile(
    name="locomo10.json",
    url="https://raw.githubusercontent.com/snap-research/LoCoMo/3eb6f2c585f5e1699204e3c3bdf7adc5c28cb376/data/locomo10.json",
    sha256="79fa87e90f04081343b8c8debecb80a9a6842b76a7aa537dc9fdf651ea698ff4",
    size_bytes=2_805_274,
)
"""LoCoMo's ten conversations at the upstream commit the benchmarks were run on."""

SHARED_LOCOMO = Path("..") / "shared" / "data" / "locomo" / "locomo10.json"
"""A copy next to the repository (relative to the working directory), used when present."""

DATASETS = {"locomo": LOCOMO}

_CHUNK = 1 << 16


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(_CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def cached_file(remote: RemoteFile, cache_dir: Path) -> Path | None:
    """The cached copy of ``remote`` in ``cache_dir`` when it is there and still has the pinned sha256."""
    path = Path(cache_dir).expanduser() / remote.name
    if path.is_file() and path.stat().st_size == remote.size_bytes and _sha256(path) == remote.sha256:
        return path
    return None


def fetch(remote: RemoteFile, cache_dir: Path, *, timeout_s: float = 60.0,
          opener: Callable[..., object] = urllib.request.urlopen,
          progress: Callable[[int], None] | None = None) -> Path:
    """Download ``remote`` into ``cache_dir`` (created if needed) and return its path.

    A copy already cached with the right digest is returned without a download. The body goes to
    a temporary file in ``cache_dir``; it is renamed to ``remote.name`` only when its size and
    sha256 match, so a bad download never replaces or poses as the real file. ``progress`` is
    called with the byte count of each chunk read.

    Raises:
        DataFetchError: the server is unreachable or answers with an error, or the body is not
            the pinned file (size or sha256 differ); nothing is left in ``cache_dir``.
        DataFolderError: ``cache_dir`` cannot be created or written (a file at its path, say).
    """
    cache_dir = Path(cache_dir).expanduser()
    found = cached_file(remote, cache_dir)
    if found is not None:
        return found
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        handle, temp_name = tempfile.mkstemp(prefix=f".{remote.name}.", suffix=".part", dir=cache_dir)
    except OSError as exc:
        raise DataFolderError(remote.url, cache_dir, exc) from exc
    digest, size = hashlib.sha256(), 0
    temp = Path(temp_name)
    try:
        with os.fdopen(handle, "wb") as out:
            try:
                with opener(remote.url, timeout=timeout_s) as response:  # type: ignore[attr-defined]
                    for block in iter(lambda: response.read(_CHUNK), b""):
                        out.write(block)
                        digest.update(block)
                        size += len(block)
                        if size > remote.size_bytes:
                            raise DataFetchError(remote.url, f"more than the expected {remote.size_bytes} bytes")
                        if progress is not None:
                            progress(len(block))
            except (urllib.error.URLError, OSError) as exc:  # HTTPError is a URLError; timeouts are OSErrors
                raise DataFetchError(remote.url, f"download failed: {getattr(exc, 'reason', exc)}") from exc
        if size != remote.size_bytes or digest.hexdigest() != remote.sha256:
            raise DataFetchError(remote.url, f"got {size} bytes with sha256 {digest.hexdigest()}, expected "
                                             f"{remote.size_bytes} bytes with sha256 {remote.sha256}; not cached")
        final = cache_dir / remote.name
        temp.replace(final)
        log.info("downloaded %s to %s", remote.url, final)
        return final
    finally:
        temp.unlink(missing_ok=True)


def locate_locomo(data: Path | None, cache_dir: Path, *, echo: Callable[[str], None] = click.echo,
                  download: Callable[[RemoteFile, Path], Path] | None = None) -> Path:
    """The LoCoMo file to use, in this order: ``data`` when given, :data:`SHARED_LOCOMO` when present,
    the cached download in ``cache_dir``, else a download (:func:`fetch`). Says which one it took.

    Raises:
        DataFetchError: nothing was found locally and the download failed.
        click.BadParameter: ``data`` was given and is not a file.
    """
    if data is not None:
        if not Path(data).is_file():
            raise click.BadParameter(f"no file at {data}", param_hint="--data")
        return Path(data)
    if SHARED_LOCOMO.is_file():
        echo(f"data: the shared copy at {SHARED_LOCOMO}")
        return SHARED_LOCOMO
    found = cached_file(LOCOMO, cache_dir)
    if found is not None:
        echo(f"data: the cached download at {found}")
        return found
    echo(f"data: downloading LoCoMo from {LOCOMO.url} into {Path(cache_dir).expanduser()}")
    path = (download or fetch)(LOCOMO, cache_dir)
    echo(f"data: {path} (sha256 checked)")
    return path


@click.group("data")
def data() -> None:
    """Benchmark data sets: download them once, checked against a pinned sha256."""


@data.command("fetch")
@click.argument("name", type=click.Choice(sorted(DATASETS)))
@click.pass_context
def fetch_command(ctx: click.Context, name: str) -> None:
    """Download NAME from its pinned upstream commit into MNEMOS_DATA_DIR (sha256 checked); print its path."""
    from tqdm import tqdm

    remote = DATASETS[name]
    cache_dir = Path(ctx.find_root().obj.data_dir).expanduser()
    with tqdm(total=remote.size_bytes, unit="B", unit_scale=True, desc=remote.name, file=sys.stderr,
              disable=None) as bar:
        try:
            path = fetch(remote, cache_dir, progress=bar.update)
        except DataFetchError as exc:
            failure = click.ClickException(str(exc))
            failure.exit_code = 2 if isinstance(exc, DataFolderError) else 1  # a setting to change
            raise failure from exc
    click.echo(str(path))
