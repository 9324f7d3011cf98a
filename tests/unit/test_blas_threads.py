"""Worker processes cap numpy's BLAS pool (settings.blas_threads) so it cannot spin against torch."""

from __future__ import annotations

import numpy as np
import pytest
from threadpoolctl import threadpool_info, threadpool_limits

from workers.runtime.errors import SettingsError
from workers.runtime.models import limit_blas_threads
from workers.settings import Settings


def _blas_threads() -> list[int]:
    return [pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"]


@pytest.fixture
def restore_blas():
    np.ones((2, 2)) @ np.ones((2, 2))  # numpy's BLAS is loaded
    original = threadpool_limits(limits=None)  # records the current limits, changes nothing
    yield
    original.restore_original_limits()


@pytest.mark.usefixtures("restore_blas")
def test_the_cap_applies_to_numpy_blas_and_none_leaves_it_alone() -> None:
    before = _blas_threads()
    assert before, "numpy has no BLAS pool that threadpoolctl can see"
    limit_blas_threads(Settings(blas_threads=None))
    assert _blas_threads() == before
    threadpool_limits(limits=2, user_api="blas")
    limit_blas_threads(Settings(blas_threads=1))
    assert _blas_threads() == [1] * len(before)


def test_blas_threads_must_be_positive() -> None:
    with pytest.raises(SettingsError, match="blas_threads"):
        Settings(blas_threads=0)
