"""Search-space primitives: properties over generated spaces, error messages, and interop with Tune and Optuna."""

from __future__ import annotations

import math
import pickle
from typing import Any

import numpy as np
import optuna.distributions as od
import pytest
from helpers import MIXED, changeable, changed_decisions, roots
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from nasplat.space import Choice, Float, Int, Space
from nasplat.space.convert import space_from_optuna, space_from_tune

PROPERTY = settings(max_examples=100, deadline=None, derandomize=True)
KEYS = st.text(alphabet="abcdefgh_", min_size=1, max_size=4)
SCALARS = st.one_of(st.integers(-5, 5), st.text(alphabet="xyz", min_size=1, max_size=3), st.booleans(), st.none())


# -- strategies --------------------------------------------------------------------------------
@st.composite
def ints(draw: st.DrawFn, *, small: bool = False) -> Int:
    log = draw(st.booleans())
    low = draw(st.integers(1, 20) if log else st.integers(-20, 20))
    span = draw(st.integers(0, 15) if small else st.one_of(st.integers(0, 40), st.integers(0, 5000)))
    return Int(low, low + span, log=log)


@st.composite
def floats(draw: st.DrawFn) -> Float:
    if draw(st.booleans()):
        low = draw(st.floats(1e-6, 10.0))
        return Float(low, low * draw(st.floats(1.5, 1e4)), log=True)
    low = draw(st.floats(-100.0, 100.0))
    return Float(low, low + draw(st.floats(1e-3, 100.0)), bins=draw(st.integers(1, 12)))


def scalar_choices() -> st.SearchStrategy[Choice]:
    return st.lists(SCALARS, min_size=1, max_size=5, unique_by=repr).map(Choice)


def domains(depth: int, *, categorical: bool) -> st.SearchStrategy[Any]:
    leaves = [scalar_choices(), ints(small=categorical)] + ([] if categorical else [floats(), SCALARS])
    if depth == 0:
        return st.one_of(*leaves)
    return st.one_of(*leaves, branches(depth - 1, categorical=categorical),
                     space_dicts(depth - 1, categorical=categorical))


def space_dicts(depth: int, *, categorical: bool) -> st.SearchStrategy[dict[str, Any]]:
    return st.dictionaries(KEYS, domains(depth, categorical=categorical), max_size=4)


@st.composite
def branches(draw: st.DrawFn, depth: int, *, categorical: bool) -> Choice:
    """A conditional Choice of dict options, told apart by a constant `kind` (as in real spaces)."""
    n = draw(st.integers(1, 3))
    options = []
    for i in range(n):
        option = draw(space_dicts(depth, categorical=categorical))
        option["kind"] = i
        options.append(option)
    return Choice(options)


def spaces(*, categorical: bool = False, depth: int = 2) -> st.SearchStrategy[Space]:
    return st.dictionaries(KEYS, domains(depth, categorical=categorical), min_size=1, max_size=5).map(Space)


SEEDS = st.integers(0, 2**32 - 1)


# -- properties ------------------------------------------------------------------------------------
@PROPERTY
@given(spaces(), SEEDS)
def test_sampled_configs_validate(space: Space, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(5):
        space.validate(space.sample(rng))


@PROPERTY
@given(spaces(), SEEDS)
def test_mutate_changes_exactly_one_decision(space: Space, seed: int) -> None:
    rng = np.random.default_rng(seed)
    config = space.sample(rng)
    snapshot = repr(config)
    can_change = any(changeable(d) for _, d, _, _ in space.decisions(config))
    for _ in range(5):
        child = space.mutate(config, rng)
        space.validate(child)
        changed = changed_decisions(space, config, child)
        if can_change:
            assert len(roots(changed)) == 1, (config, child, changed)
        else:
            assert child == config
    assert repr(config) == snapshot  # the parent is not modified


@PROPERTY
@given(spaces(), SEEDS, st.sampled_from([0.0, 0.25, 1.0]))
def test_perturbed_configs_validate(space: Space, seed: int, resample_probability: float) -> None:
    rng = np.random.default_rng(seed)
    original = space.sample(rng)
    snapshot = repr(original)
    config = original
    for _ in range(5):
        config = space.perturb(config, rng, resample_probability=resample_probability)
        space.validate(config)
    assert repr(original) == snapshot  # perturb works on a copy


@PROPERTY
@given(spaces(), SEEDS)
def test_decoded_configs_validate_and_encoding_is_stable(space: Space, seed: int) -> None:
    """Any token vector decodes to a valid config, and encoding that config again decodes to the same config."""
    rng = np.random.default_rng(seed)
    cards = space.cardinalities()
    assert all(c >= 1 for c in cards)
    for _ in range(5):
        tokens = [int(rng.integers(c)) for c in cards]
        config = space.decode(tokens)
        space.validate(config)
        encoded = space.encode(config)
        assert len(encoded) == len(cards) and all(0 <= t < c for t, c in zip(encoded, cards))
        assert space.decode(encoded) == config
        sampled = space.sample(rng)
        assert space.encode(space.decode(space.encode(sampled))) == space.encode(sampled)


@PROPERTY
@given(spaces(categorical=True), SEEDS)
def test_categorical_round_trip(space: Space, seed: int) -> None:
    """With Choice and Int only, decode(encode(config)) == config, conditional branches included."""
    rng = np.random.default_rng(seed)
    for _ in range(5):
        config = space.sample(rng)
        assert space.decode(space.encode(config)) == config


@PROPERTY
@given(ints(), SEEDS)
def test_binned_int_tokens_are_exact(domain: Int, seed: int) -> None:
    """Each token of an Int decodes to a value that encodes back to it, and encode is monotone."""
    for token in range(domain.cardinality):
        value = domain.decode(token)
        domain.check("x", value)
        assert domain.encode(value) == token
    rng = np.random.default_rng(seed)
    values = sorted({domain.sample(rng) for _ in range(20)} | {domain.low, domain.high})
    tokens = [domain.encode(v) for v in values]
    assert tokens == sorted(tokens) and tokens[0] == 0 and tokens[-1] == domain.cardinality - 1


# -- validation messages -------------------------------------------------------------------------------
def _bad_values(domain: Any) -> list[Any]:
    if isinstance(domain, Int):
        return [domain.high + 1, domain.low - 1, "3", 2.5, True]
    if isinstance(domain, Float):
        return [domain.high + abs(domain.high) + 1.0, domain.low - abs(domain.low) - 1.0, "0.5", None, math.nan]
    return ["no such option", 9.75]


@PROPERTY
@given(spaces(), SEEDS, st.data())
def test_validate_names_the_key_and_the_value(space: Space, seed: int, data: st.DataObject) -> None:
    config = space.sample(np.random.default_rng(seed))
    decisions = list(space.decisions(config))
    assume(decisions)
    path, domain, _, holder = data.draw(st.sampled_from(decisions))
    key = path.rsplit(".", 1)[-1]  # generated keys hold no dots
    prefix = path[: len(path) - len(key)]
    original = holder[key]

    for bad in _bad_values(domain):
        holder[key] = bad
        with pytest.raises((ValueError, TypeError)) as info:
            space.validate(config)
        assert repr(path) in str(info.value) and repr(bad) in str(info.value), (path, bad, str(info.value))

    del holder[key]
    with pytest.raises(ValueError, match="missing") as info:
        space.validate(config)
    assert repr(path) in str(info.value)

    holder[key] = original
    holder["zz_unknown"] = 12345
    with pytest.raises(ValueError, match="unknown") as info:
        space.validate(config)
    assert repr(prefix + "zz_unknown") in str(info.value) and "12345" in str(info.value)
    del holder["zz_unknown"]
    space.validate(config)


def test_validate_messages_on_the_mixed_space() -> None:
    good = {"op": "skip", "layers": 2, "lr": 0.01, "head": {"kind": "mlp", "hidden": 64, "act": "relu"}}
    MIXED.validate(good)
    cases = [
        ({**good, "layers": 9}, ValueError, r"'layers' must be in \[1, 8\], got 9"),
        ({**good, "layers": "2"}, TypeError, r"'layers' must be an integer in \[1, 8\], got '2'"),
        ({**good, "lr": 1.0}, ValueError, r"'lr' must be in \[0.0001, 0.1\], got 1.0"),
        ({**good, "op": "conv7x7"}, ValueError, r"'op': 'conv7x7' is not one of"),
        ({**good, "head": {"kind": "mlp", "hidden": 2048, "act": "relu"}}, ValueError, r"'head.hidden'.*2048"),
        ({**good, "head": {"kind": "mlp", "act": "relu"}}, ValueError, r"missing keys \['head.hidden'\]"),
        ({**good, "head": {"kind": "linear", "act": "relu"}}, ValueError, r"unknown.*'head.act': 'relu'"),
        ({**good, "head": "linear"}, ValueError, r"'head': 'linear' is not one of"),
        ("op=skip", TypeError, r"config must be a dict, got 'op=skip'"),
    ]
    for config, error, pattern in cases:
        with pytest.raises(error, match=pattern):
            MIXED.validate(config)


@PROPERTY
@given(st.integers(-1000, 1000), st.integers(1, 1000))
def test_bad_int_bounds(low: int, gap: int) -> None:
    with pytest.raises(ValueError) as info:
        Int(low, low - gap)
    assert f"low={low}" in str(info.value) and f"high={low - gap}" in str(info.value)
    if low < 1:
        with pytest.raises(ValueError, match=f"low={low}.*log=True"):
            Int(low, low + gap, log=True)


@PROPERTY
@given(st.floats(-1e6, 1e6), st.floats(0.0, 1e6))
def test_bad_float_bounds(low: float, gap: float) -> None:
    with pytest.raises(ValueError) as info:
        Float(low, low - gap)
    assert f"low={low!r}" in str(info.value) and f"high={low - gap!r}" in str(info.value)
    if low <= 0:
        with pytest.raises(ValueError, match="log=True") as info:
            Float(low, abs(low) + gap + 1.0, log=True)
        assert f"low={low!r}" in str(info.value)


def test_bad_domain_construction_messages() -> None:
    cases = [
        (lambda: Int(5, 1), ValueError, r"low=5, high=1"),
        (lambda: Int(0, 10, log=True), ValueError, r"low=0, high=10, log=True"),
        (lambda: Int(1.5, 3), TypeError, r"low=1.5"),
        (lambda: Int(True, 3), TypeError, r"low=True"),
        (lambda: Int(1, 3, bins=0), ValueError, r"bins=0"),
        (lambda: Float(1, 0), ValueError, r"low=1, high=0"),
        (lambda: Float(0, 1, log=True), ValueError, r"low=0, high=1, log=True"),
        (lambda: Float(0, math.inf), ValueError, r"high=inf"),
        (lambda: Float("a", 1.0), TypeError, r"low='a'"),
        (lambda: Choice([]), ValueError, r"got \[\]"),
        (lambda: Choice("abc"), ValueError, r"got 'abc'"),
        (lambda: Space({1: Int(0, 1)}), TypeError, r"got 1"),
        (lambda: Space([("a", 1)]), TypeError, r"\[\('a', 1\)\]"),
    ]
    for build, error, pattern in cases:
        with pytest.raises(error, match=pattern):
            build()


# -- behaviour of single operations ---------------------------------------------------------------------
def test_mutate_spreads_over_decisions() -> None:
    """Each of the NAS-Bench-201-like space's 6 decisions is mutated about equally often."""
    ops = ["none", "skip", "conv1", "conv3", "pool"]
    space = Space({f"e{i}": Choice(ops) for i in range(6)})
    rng = np.random.default_rng(0)
    config = space.sample(rng)
    counts = np.zeros(6)
    for _ in range(3000):
        (path,) = changed_decisions(space, config, space.mutate(config, rng))
        counts[int(path[1:])] += 1
    assert np.all(np.abs(counts / 3000 - 1 / 6) < 0.03), counts


def test_mutate_and_perturb_handle_dotted_keys() -> None:
    space = Space({"a.b": Choice([1, 2]), "c": {"d.e": Int(0, 3)}})
    rng = np.random.default_rng(0)
    config = space.sample(rng)
    for _ in range(20):
        space.validate(space.mutate(config, rng))
        space.validate(space.perturb(config, rng))


def test_mutate_with_duplicate_options_still_changes_a_decision() -> None:
    space = Space({"x": Choice([1, 1, 2]), "y": Choice(["a"])})
    rng = np.random.default_rng(0)
    for _ in range(20):
        assert space.mutate({"x": 1, "y": "a"}, rng) == {"x": 2, "y": "a"}
        assert space.mutate({"x": 2, "y": "a"}, rng) == {"x": 1, "y": "a"}


def test_sampled_values_do_not_alias_the_space() -> None:
    space = Space({"sizes": Choice([[1, 2], [3]]), "const": [4, 5]})
    config = space.sample(np.random.default_rng(0))
    config["sizes"].append(99)
    config["const"].append(99)
    assert space.domains["sizes"].options == [[1, 2], [3]] and space.domains["const"] == [4, 5]


def test_log_domains_sample_log_uniformly() -> None:
    rng = np.random.default_rng(0)
    lr = np.array([Float(1e-5, 1e-1, log=True).sample(rng) for _ in range(4000)])
    counts = np.histogram(np.log10(lr), bins=4, range=(-5, -1))[0]
    assert np.all(np.abs(counts / 4000 - 0.25) < 0.03), counts
    width = np.array([Int(1, 1023, log=True).sample(rng) for _ in range(4000)])
    assert 0.45 < np.mean(width < 32) < 0.55 and width.min() == 1 and width.max() <= 1023


def test_perturb_nudges_numbers_by_the_pbt_factors() -> None:
    space = Space({"lr": Float(1e-5, 1.0, log=True), "n": Int(1, 1000)})
    rng = np.random.default_rng(0)
    seen = set()
    for _ in range(50):
        new = space.perturb({"lr": 0.01, "n": 100}, rng, resample_probability=0.0)
        seen.add((round(new["lr"] / 0.01, 6), new["n"]))
    assert {r for r, _ in seen} == {0.8, 1.2} and {n for _, n in seen} == {80, 120}
    with pytest.raises(ValueError, match="resample_probability=1.5"):
        space.perturb({"lr": 0.01, "n": 100}, rng, resample_probability=1.5)


def test_encode_layout_and_default() -> None:
    assert MIXED.cardinalities() == [4, 8, 8, 2, 16, 3]
    config = {"op": "maxpool", "layers": 3, "lr": 0.1, "head": {"kind": "mlp", "hidden": 16, "act": "tanh"}}
    assert MIXED.encode(config) == [2, 2, 7, 1, 0, 2]
    assert MIXED.encode({**config, "head": {"kind": "linear"}}) == [2, 2, 7, 0, 0, 0]
    assert MIXED.default() == {"op": "conv3x3", "layers": 1, "lr": pytest.approx(1e-4 * 10 ** (3 / 16)),
                               "head": {"kind": "linear"}}
    with pytest.raises(ValueError, match="needs 6 tokens.*got 2"):
        MIXED.decode([0, 0])
    with pytest.raises(ValueError, match=r"token must be in \[0, 3\], got 4"):
        MIXED.decode([4, 0, 0, 0, 0, 0])


# -- interop -------------------------------------------------------------------------------------
def _bounds(domain: Any) -> tuple[type, float, float, bool]:
    return type(domain), domain.low, domain.high, domain.log


def test_space_from_tune() -> None:
    from ray import tune

    param_space = {
        "op": tune.choice(["conv", "pool"]),
        "dropout": tune.uniform(0.0, 0.5),
        "lr": tune.loguniform(1e-4, 1e-1),
        "layers": tune.randint(1, 5),
        "width": tune.lograndint(8, 513),
        "batch": tune.qrandint(16, 128, 16),
        "seed": tune.grid_search([0, 1, 2]),
        "optim": {"name": "sgd", "momentum": tune.uniform(0.8, 0.99)},
        "epochs": 10,
    }
    space = space_from_tune(param_space)
    d = space.domains
    assert isinstance(d["op"], Choice) and d["op"].options == ["conv", "pool"]
    assert _bounds(d["dropout"]) == (Float, 0, 0.5, False)
    assert _bounds(d["lr"]) == (Float, 1e-4, 1e-1, True)
    assert _bounds(d["layers"]) == (Int, 1, 4, False)
    assert _bounds(d["width"]) == (Int, 8, 512, True)
    assert isinstance(d["batch"], Choice) and d["batch"].options == [16, 32, 48, 64, 80, 96, 112, 128]
    assert isinstance(d["seed"], Choice) and d["seed"].options == [0, 1, 2]
    assert isinstance(d["optim"], Space) and d["optim"].domains["name"] == "sgd" and d["epochs"] == 10
    rng = np.random.default_rng(0)
    layers = set()
    for _ in range(200):
        config = space.sample(rng)
        space.validate(config)
        layers.add(config["layers"])
    assert layers == {1, 2, 3, 4}
    flat = ("op", "dropout", "lr", "layers", "width", "batch")
    for _ in range(50):  # what Tune itself samples is valid here too
        tune_config = {k: param_space[k].sample() for k in flat}
        space.validate({**tune_config, "seed": 1, "optim": {"name": "sgd", "momentum": 0.9}, "epochs": 10})


def test_space_from_tune_rejects_what_it_cannot_express() -> None:
    from ray import tune

    with pytest.raises(TypeError, match="'noise'.*randn"):
        space_from_tune({"noise": tune.randn(0.0, 1.0)})
    with pytest.raises(TypeError, match="'f'"):
        space_from_tune({"f": tune.sample_from(lambda _: 1)})


def test_space_from_optuna() -> None:
    space = space_from_optuna({
        "opt": od.CategoricalDistribution(["adam", "sgd"]),
        "layers": od.IntDistribution(1, 6),
        "width": od.IntDistribution(8, 256, log=True),
        "batch": od.IntDistribution(16, 64, step=16),
        "lr": od.FloatDistribution(1e-5, 1e-1, log=True),
        "dropout": od.FloatDistribution(0.0, 0.5),
        "frac": od.FloatDistribution(0.0, 1.0, step=0.25),
    })
    d = space.domains
    assert isinstance(d["opt"], Choice) and d["opt"].options == ["adam", "sgd"]
    assert _bounds(d["layers"]) == (Int, 1, 6, False)
    assert _bounds(d["width"]) == (Int, 8, 256, True)
    assert isinstance(d["batch"], Choice) and d["batch"].options == [16, 32, 48, 64]
    assert _bounds(d["lr"]) == (Float, 1e-5, 1e-1, True)
    assert _bounds(d["dropout"])[:3] == (Float, 0.0, 0.5)
    assert isinstance(d["frac"], Choice) and d["frac"].options == [0.0, 0.25, 0.5, 0.75, 1.0]
    rng = np.random.default_rng(0)
    for _ in range(100):
        space.validate(space.sample(rng))
    with pytest.raises(TypeError, match="'x'"):
        space_from_optuna({"x": "not a distribution"})


def test_float_neighbours_step_a_tenth_of_the_range_on_its_scale_including_from_zero() -> None:
    # before: x0.8 and x1.2 of the value, so 0.0 had no neighbour and small values hardly moved (issue 31)
    rng = np.random.default_rng(0)
    unit = Float(0.0, 1.0)
    assert unit.neighbours(0.0, rng) == [pytest.approx(0.1)]
    assert unit.neighbours(0.001, rng) == [0.0, pytest.approx(0.101)]
    assert unit.neighbours(0.5, rng) == [pytest.approx(0.4), pytest.approx(0.6)]
    assert unit.neighbours(1.0, rng) == [pytest.approx(0.9)]
    assert Float(-1.0, 1.0).neighbours(0.0, rng) == [pytest.approx(-0.2), pytest.approx(0.2)]
    assert Float(0.0, 10.0).neighbours(9.5, rng) == [pytest.approx(8.5), 10.0]
    lr = Float(1e-4, 1.0, log=True)  # factor (1 / 1e-4) ** 0.1 = 10 ** 0.4
    assert lr.neighbours(1e-2, rng) == [pytest.approx(1e-2 / 10 ** 0.4), pytest.approx(1e-2 * 10 ** 0.4)]
    assert lr.neighbours(1e-4, rng) == [pytest.approx(1e-4 * 10 ** 0.4)]
    space = Space({"dropout": Float(0.0, 0.5), "lr": lr, "n": Choice([1, 2])})
    config = {"dropout": 0.0, "lr": 1e-2, "n": 1}
    first = space.neighbours(config, np.random.default_rng(1))
    assert first == space.neighbours(config, np.random.default_rng(2))  # the same whatever the stream
    assert [c["dropout"] for c in first if c["dropout"] != 0.0] == [pytest.approx(0.05)]
    assert len(first) == 4 and all(space.accepts(c) for c in first)
    # mutate and perturb stay seeded: the same seed draws the same configs
    draws = [[space.mutate(config, r), space.perturb(config, r)] for r in (np.random.default_rng(5),
                                                                           np.random.default_rng(5))]
    assert draws[0] == draws[1]


def test_a_pickle_made_before_choice_moved_to_its_own_module_still_loads() -> None:
    """A spec pickled before `Choice` left `nasplat.space.space` (an `experiment.pkl`) names it there."""
    space = Space({"a": Choice([1, 2, {"b": Int(0, 3)}]), "c": Int(1, 1)})
    made_before = pickle.dumps(space, protocol=0).replace(b"cnasplat.space.choice\nChoice\n",
                                                          b"cnasplat.space.space\nChoice\n")
    assert b"nasplat.space.choice" not in made_before
    loaded = pickle.loads(made_before)
    assert type(loaded.domains["a"]) is Choice and loaded.domains["a"].changeable
    config = {"a": {"b": 2}, "c": 1}
    loaded.validate(config)
    child = loaded.mutate(config, np.random.default_rng(0))
    assert child != config and child["c"] == 1
