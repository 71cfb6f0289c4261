"""Shared fixtures: one real local Ray and one MLflow server for the whole session, the shared reference data; the
Hypothesis profiles."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings
from servers import mlflow_server

# Hypothesis profiles. `ci` (the default: `make test`, CI) draws the same examples on every run: derandomized, no
# example database, no deadline (timings on shared cores are not part of a test). `explore` is run on purpose to
# find new failures: random draws, ten times the examples in tests/test_fuzz.py, failures saved in `.hypothesis/`
# and replayed first next time. Choose one with `--hypothesis-profile=explore` or `HYPOTHESIS_PROFILE=explore`.
settings.register_profile("ci", max_examples=100, derandomize=True, database=None, deadline=None, print_blob=True)
settings.register_profile("explore", max_examples=1000, derandomize=False, deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

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


@pytest.fixture(scope="session")
def mlflow_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real MLflow tracking server on 127.0.0.1, started for the first test that needs it (30-60 s here)."""
    with mlflow_server(tmp_path_factory.mktemp("mlflow")) as url:
        yield url
