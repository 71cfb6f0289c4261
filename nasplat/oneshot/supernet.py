"""The supernet: a model whose `ChoiceLayer`s and `ChoiceInput`s are the decisions of a space.

`space()` is the `Space` of those decisions (one `Choice` per key, in the order the model registers them), so every
controller, constraint and encoding of nasplat applies to its paths unchanged; `select(config)` puts the model on
the path of a config; `extract(config)` returns that path as a standalone module holding copies of exactly its
weights. The functions work on any `nn.Module` holding decisions; `Supernet` is the same as methods.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from nasplat.oneshot.layers import ChoiceInput, ChoiceLayer, Decision, Pick
from nasplat.space import Config, Rule, Space


def decisions(model: nn.Module) -> list[Decision]:
    """Every decision module of `model`, in registration order (a shared module once)."""
    return [m for m in model.modules() if isinstance(m, Decision)]


def keyed(model: nn.Module) -> dict[str, list[Decision]]:
    """The decision modules of `model` by key, keys in order of first appearance; layers sharing a key must
    share its options."""
    out: dict[str, list[Decision]] = {}
    for decision in decisions(model):
        group = out.setdefault(decision.key, [])
        if group and decision.options != group[0].options:
            raise ValueError(f"two decisions share the key {decision.key!r} with different options: "
                             f"{group[0].options!r} and {decision.options!r}")
        group.append(decision)
    return out


def space_of(model: nn.Module, *, forbidden: Mapping[str, Rule] | None = None) -> Space:
    """The space of `model`'s paths: `{key: Choice(options)}`, with the rules `forbidden` names (if any)."""
    return Space({key: copy.deepcopy(group[0].domain) for key, group in keyed(model).items()}, forbidden=forbidden)


def select(model: nn.Module, config: Mapping[str, Any]) -> None:
    """Put every decision of `model` on the path `config` (keys of `config` that are no decision are ignored: a
    trial's config may hold hyperparameters too). A missing key or a value that is no option raises."""
    groups = keyed(model)
    missing = [key for key in groups if key not in config]
    if missing:
        raise KeyError(f"the config has no value for the decisions {missing}; the supernet's keys: {list(groups)}")
    for key, group in groups.items():
        for decision in group:
            decision.select(config[key])


def mix(model: nn.Module, weights: Mapping[str, torch.Tensor], *, hard: bool = False) -> None:
    """Put every decision of `model` in mixture mode with `weights[key]` (one weight per option; see `Decision.mix`)."""
    for key, group in keyed(model).items():
        if key not in weights:
            raise KeyError(f"no architecture weights for the decision {key!r}")
        for decision in group:
            decision.mix(weights[key], hard=hard)


def selected(model: nn.Module) -> Config:
    """The path `model` is on: `{key: option}` (None for a decision in mixture mode or never selected)."""
    return {key: group[0].chosen for key, group in keyed(model).items()}


def unused_parameters(model: nn.Module) -> list[nn.Parameter]:
    """Parameters of candidates the current path (or hard sample) does not run, each once, none that the path uses."""
    unused = {id(p): p for d in decisions(model) if isinstance(d, ChoiceLayer) for p in d.unused_parameters()}
    path = {id(p) for p in _path_parameters(model)}
    return [p for i, p in unused.items() if i not in path]


def _path_parameters(model: nn.Module) -> list[nn.Parameter]:
    """Parameters outside every candidate, and those of the candidates the current path runs."""
    layers = [d for d in decisions(model) if isinstance(d, ChoiceLayer)]
    inside = {id(p) for d in layers for p in d.candidates.parameters()}
    out = [p for p in model.parameters() if id(p) not in inside]
    for d in layers:
        if d.weights is None and d.index is not None:
            out.extend(d.candidate(d.index).parameters())
        elif d.weights is not None and d.hard:
            out.extend(d.candidate(int(d.weights.detach().argmax())).parameters())
        elif d.weights is not None:
            out.extend(d.candidates.parameters())
    return out


def drop_unused_grads(model: nn.Module) -> int:
    """Set `grad = None` on the parameters the current path does not run, so that the optimizer skips them (no
    weight decay, no momentum step on weights this batch did not train); returns how many were dropped."""
    dropped = 0
    for p in unused_parameters(model):
        if p.grad is not None:
            p.grad, dropped = None, dropped + 1
    return dropped


def set_touch(model: nn.Module, on: bool = True) -> None:
    """With `on`, each `ChoiceLayer` in path mode adds `0 * sum(unused candidates' parameters)` to its output while
    training, so that every parameter gets a (zero) gradient: what DistributedDataParallel with
    `find_unused_parameters=False` needs to reduce gradients when each step runs another path."""
    for d in decisions(model):
        d.touch = on


def extract(model: nn.Module, config: Mapping[str, Any] | None = None) -> nn.Module:
    """The path `config` (default: the one selected) as a standalone module: a copy of `model` in which every
    `ChoiceLayer` is replaced by a copy of its chosen candidate and every `ChoiceInput` by a `Pick`. It holds copies
    of exactly the weights (and batch-norm statistics) of the path, no unused candidate, and in eval mode gives the
    same outputs as `model` on that path. `model` is left on the path `config`; its tensors are not written."""
    if config is not None:
        select(model, config)
    memo: dict[int, Any] = {}
    for module in reversed(list(model.modules())):  # children before their parents: nested decisions first
        if isinstance(module, ChoiceLayer):
            memo[id(module)] = copy.deepcopy(module.candidate(module._require_index()), memo)
        elif isinstance(module, ChoiceInput):
            memo[id(module)] = Pick(module._require_index())
    return copy.deepcopy(model, memo)


class Supernet(nn.Module):
    """Base class of a supernet: write `__init__` with `ChoiceLayer`/`ChoiceInput` modules and `forward` as usual.

    `space()` gives the paths' `Space`; `select(config)` (returns `self`) sets the path every later forward runs;
    `extract(config)` returns the path as a standalone module with copies of its weights; `mix(weights)` runs a
    weighted mixture (gradient-based search). A forward before any `select`/`mix` raises."""

    def decisions(self) -> list[Decision]:
        return decisions(self)

    def space(self, *, forbidden: Mapping[str, Rule] | None = None) -> Space:
        return space_of(self, forbidden=forbidden)

    def select(self, config: Mapping[str, Any]) -> Supernet:
        select(self, config)
        return self

    def mix(self, weights: Mapping[str, torch.Tensor], *, hard: bool = False) -> Supernet:
        mix(self, weights, hard=hard)
        return self

    def selected(self) -> Config:
        return selected(self)

    def extract(self, config: Mapping[str, Any] | None = None) -> nn.Module:
        return extract(self, config)

    def unused_parameters(self) -> list[nn.Parameter]:
        return unused_parameters(self)

    def drop_unused_grads(self) -> int:
        return drop_unused_grads(self)

    def set_touch(self, on: bool = True) -> None:
        set_touch(self, on)


def check_same_decisions(space: Space, model: nn.Module) -> Space:
    """`space`, if it has exactly the decisions of `model` (same keys, same options in the same order; its rules
    are free); else a ValueError saying where they differ."""
    own = space_of(model)
    theirs = {k: getattr(d, "options", d) for k, d in space.domains.items()}
    mine = {k: d.options for k, d in own.domains.items()}
    if theirs != mine:
        raise ValueError(f"the space's decisions {theirs!r} differ from the supernet's {mine!r}")
    return space
