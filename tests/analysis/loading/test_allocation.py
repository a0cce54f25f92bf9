"""The analysis process keeps the memory it frees for its next arrays."""

from __future__ import annotations

import platform

import numpy as np
import pyarrow as pa
import pytest

from stepscope.analysis.loading.allocation import reuse_freed_memory


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the C library here is not glibc")
def test_freed_memory_stays_in_the_process_and_numpy_asks_for_no_huge_pages() -> None:
    assert reuse_freed_memory() is True
    assert np._core.multiarray._set_madvise_hugepage(False) is False  # it was off already
    assert pa.default_memory_pool().backend_name == "system"  # Arrow's arrays from the same heap as numpy's
