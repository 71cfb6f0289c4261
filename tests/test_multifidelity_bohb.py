"""The Tune BOHB side of benchmarks/multifidelity.py: its ConfigSpace is the CNN space, each BOHB config maps to a
config the nasplat space accepts, and the trainable keeps its state exactly at Hyperband's rung steps."""

from __future__ import annotations

from collections import Counter

from benchmarks_path import BENCHMARKS  # noqa: F401  (puts benchmarks/ on sys.path)
from multifidelity_bohb import config_space, rung_steps, to_config

from nasplat.space import Space
from search_spaces.cnn import space_1d


def test_every_bohb_config_maps_to_a_config_of_the_nasplat_space():
    space = Space({**space_1d.domains, "train_size": 1000})
    flats = [dict(c) for c in config_space(seed=0).sample_configuration(300)]
    depths = Counter()
    for flat in flats:
        config = to_config(flat, train_size=1000)
        space.validate(config)  # raises naming the key if a value or key is wrong
        n = config["depth"]["n"]
        depths[n] += 1
        # a block beyond the depth is inactive in BOHB's space: absent from its config, as from nasplat's
        assert all(f"layer{i}_channels" not in flat for i in range(n, 3))
        assert all(f"layer{i}_channels" in flat for i in range(n))
    assert set(depths) == {1, 2, 3}
    assert len({(f["lr"], f["momentum"]) for f in flats}) == len(flats)  # continuous values really vary


def test_bohb_space_has_every_decision_of_the_nasplat_space():
    names = set(config_space(seed=0))
    assert {"depth", "head", "lr", "momentum", "batch_size", "weight_decay"} <= names
    assert {f"layer{i}_{key}" for i in range(3) for key in ("channels", "kernel", "activation", "pool")} <= names


def test_rung_steps_are_hyperbands_pause_points():
    assert rung_steps(27, 3) == {1, 3, 9}
    assert rung_steps(9, 3) == {1, 3}
    assert rung_steps(3, 3) == {1}
    assert rung_steps(2, 3) == set()
