"""Shared fixtures: one real local Ray for the whole session, the shared reference data."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("NASPLAT_SHARED_DATA", REPO.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The folder holding nb201.csv (`$NASPLAT_SHARED_DATA`, else ../shared/data beside the repo)."""
    if not (SHARED_DATA / "nb201.csv").exists():
        pytest.fail(f"NAS-Bench-201 table missing at {SHARED_DATA}; set NASPLAT_SHARED_DATA")
    return SHARED_DATA


@pytest.fixture(scope="session")
def ray_session() -> str:
    """A real local Ray (4 logical CPUs) shared by every test; yields its GCS address for subprocess drivers."""
    import ray

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False,
             _system_config={"metrics_report_interval_ms": 1000})
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()
