"""Fixtures shared by every part's tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("STEPSCOPE_SHARED", REPO.parent / "shared"))
TRACES = SHARED / "data" / "traces"
HTA_REFERENCE = SHARED / "data" / "hta_reference"


@pytest.fixture(scope="session")
def shared_traces() -> Path:
    """The real Kineto traces in ../shared/data/traces (never copied into the repo)."""
    if not TRACES.is_dir():
        pytest.skip(f"real traces not found at {TRACES} (set STEPSCOPE_SHARED to the shared folder)")
    return TRACES


@pytest.fixture(scope="session")
def hta_reference() -> Path:
    if not HTA_REFERENCE.is_dir():
        pytest.skip(f"HTA reference results not found at {HTA_REFERENCE} (set STEPSCOPE_SHARED)")
    return HTA_REFERENCE
