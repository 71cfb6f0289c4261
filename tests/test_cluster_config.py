"""`cluster.yaml` passes Ray's own cluster-launcher validation and describes the cluster nasplat needs."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

util = pytest.importorskip("ray.autoscaler._private.util", reason="Ray's autoscaler (ray[default]) is not installed")
jsonschema = pytest.importorskip("jsonschema", reason="Ray's config validator needs jsonschema")

CLUSTER_YAML = Path(__file__).resolve().parents[1] / "cluster.yaml"


def load() -> dict[str, Any]:
    return yaml.safe_load(CLUSTER_YAML.read_text())


def prepared(config: dict[str, Any]) -> dict[str, Any]:
    """What `ray up` does before talking to the cloud: fill in defaults, merge commands, validate."""
    config = util.prepare_config(copy.deepcopy(config))
    util.validate_config(config)
    return config


@pytest.fixture(scope="module")
def config() -> dict[str, Any]:
    return prepared(load())


def test_validates_with_rays_validator(config: dict[str, Any]) -> None:
    assert config["provider"]["type"] == "aws"
    assert config["cluster_name"] == "nasplat"


def test_head_and_worker_types(config: dict[str, Any]) -> None:
    types = config["available_node_types"]
    assert config["head_node_type"] == "head.cpu"
    assert set(types) == {"head.cpu", "worker.cpu", "worker.gpu"}
    assert types["head.cpu"]["max_workers"] == 0  # filled in by prepare_config: exactly one head
    assert "GPU" not in types["head.cpu"]["resources"]
    assert "GPU" not in types["worker.cpu"]["resources"]
    assert types["worker.gpu"]["resources"]["GPU"] >= 1
    assert types["worker.gpu"]["node_config"]["InstanceType"].startswith(("g", "p"))
    for name in ("worker.cpu", "worker.gpu"):
        assert 0 <= types[name]["min_workers"] <= types[name]["max_workers"] <= config["max_workers"]
    assert sum(types[n]["max_workers"] for n in ("worker.cpu", "worker.gpu")) <= config["max_workers"]


def test_setup_installs_torch_and_nasplat_on_every_node(config: dict[str, Any]) -> None:
    for key in ("head_setup_commands", "worker_setup_commands"):  # setup_commands merged into both
        commands = " ; ".join(config[key])
        assert "pip install torch==2.13.0" in commands, key
        assert any("pip install" in c and "nasplat" in c for c in config[key]), key
    assert "~/nasplat" in config["file_mounts"]  # the project's working tree, where `pip install -e` points
    assert config["file_mounts"]["~/nasplat"] == "."
    start = " ".join(config["head_start_ray_commands"])
    assert "--head" in start and "--dashboard-host=0.0.0.0" in start and "--metrics-export-port" in start


def test_ray_version_on_the_cluster_matches_this_one(config: dict[str, Any]) -> None:
    import ray

    assert any(f"ray[default]=={ray.__version__}" in c for c in config["setup_commands"])


def test_the_validator_rejects_a_bad_config() -> None:
    """The checks above are only worth something if Ray's validator would catch a broken file."""
    bad = load()
    bad["available_node_types"]["worker.gpu"]["gpus"] = 1  # not a node-type field
    with pytest.raises(jsonschema.ValidationError, match="gpus"):
        prepared(bad)
    bad = load()
    bad["available_node_types"]["worker.cpu"]["min_workers"] = bad["max_workers"] + 1
    with pytest.raises(ValueError, match="max_workers"):
        prepared(bad)
    bad = load()
    bad["head_node_type"] = "head.gpu"
    with pytest.raises(ValueError, match="head_node_type"):
        prepared(bad)
