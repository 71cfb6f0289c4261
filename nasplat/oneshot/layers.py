"""Decisions inside a PyTorch model: a layer whose operation, or an edge whose input, is a `Choice` of a space.

`ChoiceLayer(key, {"option": module, ...})` holds its candidate modules side by side; `ChoiceInput(key, options)`
picks one of the tensors a cell node could read. Every decision runs in one of two modes, set by the `Supernet`
that holds it (`nasplat.oneshot.supernet`):

- a path: `select(option)` runs only the chosen candidate (single-path training, evaluation, extraction);
- a mixture: `mix(weights)` runs `sum_i w_i * candidate_i(x)` (DARTS); with `hard=True` the weights are one-hot
  with gradients (GDAS's straight-through Gumbel sample) and only the chosen candidate runs.

Layers that share a key share the decision (one value in the config, one architecture weight vector).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from nasplat.space import Choice


def module_name(option: Any) -> str:
    """The `nn.ModuleDict` name of a candidate: the option as text, dots replaced (torch refuses them)."""
    name = str(option).replace(".", "_")
    if not name:
        raise ValueError(f"an option must have a non-empty text form, got {option!r}")
    return name


class Decision(nn.Module):
    """What `ChoiceLayer` and `ChoiceInput` share: the key, the options (a `Choice`), the mode and its state."""

    def __init__(self, key: str, options: Sequence[Any]) -> None:
        super().__init__()
        if not isinstance(key, str) or not key:
            raise ValueError(f"a decision's key must be a non-empty string, got {key!r}")
        if isinstance(options, (str, bytes)) or not isinstance(options, Sequence) or len(options) == 0:
            raise ValueError(f"decision {key!r} needs a non-empty list of options, got {options!r}")
        if any(isinstance(o, Mapping) for o in options):
            raise ValueError(f"decision {key!r}: options must be plain values, not sub-spaces, got {options!r}")
        self.key = key
        self.options: list[Any] = list(options)
        self.domain = Choice(self.options)
        self.index: int | None = None  # the selected option's position (path mode)
        self.weights: torch.Tensor | None = None  # one weight per option (mixture mode)
        self.hard = False  # mixture weights are one-hot with gradients: run only the argmax
        self.touch = False  # path or hard mode: unused candidates' parameters get a zero gradient (DDP: set_touch)

    def select(self, value: Any) -> None:
        """Run the path through `value` (an option; checked as `Choice` checks it)."""
        self.index = self.domain.index(self.key, value)
        self.weights, self.hard = None, False

    def mix(self, weights: torch.Tensor, *, hard: bool = False) -> None:
        """Run the mixture `sum_i weights[i] * candidate_i`; `hard`: weights one-hot, only the argmax runs."""
        if weights.dim() != 1 or weights.numel() != len(self.options):
            raise ValueError(f"decision {self.key!r} has {len(self.options)} options, got weights of shape "
                             f"{tuple(weights.shape)}")
        self.weights, self.hard, self.index = weights, hard, None

    @property
    def chosen(self) -> Any:
        """The option the current path runs (None in mixture mode or before any selection)."""
        return None if self.index is None else self.options[self.index]

    def _require_index(self) -> int:
        if self.index is None:
            raise RuntimeError(f"decision {self.key!r} has no path selected: call supernet.select(config) or "
                               f"supernet.mix(weights) before the forward pass")
        return self.index

    def _mixture(self, branch: Callable[[int], torch.Tensor]) -> torch.Tensor:
        """`sum_i w_i * branch(i)`; hard weights run only the argmax and add the others' (zero) weights so that
        every weight gets its straight-through gradient (as GDAS does)."""
        assert self.weights is not None
        weights = self.weights
        if self.hard:
            chosen = int(weights.detach().argmax())
            out = weights[chosen] * branch(chosen)
            for i in range(len(self.options)):
                if i != chosen:
                    out = out + weights[i]
            return out
        out = weights[0] * branch(0)
        for i in range(1, len(self.options)):
            out = out + weights[i] * branch(i)
        return out

    def extra_repr(self) -> str:
        state = f"chosen={self.chosen!r}" if self.index is not None else ("mixture" if self.weights is not None
                                                                          else "unselected")
        return f"key={self.key!r}, options={self.options!r}, {state}"


class ChoiceLayer(Decision):
    """A layer whose operation is the decision `key`: one candidate module per option, all held side by side.

    `candidates` maps each option (a string, number, bool, None: any value a `Choice` takes) to its module, in the
    order the space lists the options. The modules live in `self.candidates` (an `nn.ModuleDict` named by
    `module_name(option)`), so the supernet's `state_dict` names each candidate's weights."""

    def __init__(self, key: str, candidates: Mapping[Any, nn.Module]) -> None:
        if not isinstance(candidates, Mapping):
            raise TypeError(f"ChoiceLayer {key!r} needs a mapping option -> nn.Module, got {candidates!r}")
        super().__init__(key, list(candidates))
        names = [module_name(o) for o in self.options]
        if len(set(names)) != len(names):
            raise ValueError(f"ChoiceLayer {key!r}: options {self.options!r} give clashing module names {names!r}")
        for option, module in candidates.items():
            if not isinstance(module, nn.Module):
                raise TypeError(f"ChoiceLayer {key!r}: the candidate for {option!r} must be an nn.Module, got "
                                f"{type(module).__name__}")
        self.candidates = nn.ModuleDict({name: candidates[o] for name, o in zip(names, self.options)})
        self._names = names

    def candidate(self, index: int) -> nn.Module:
        """The module of option number `index`."""
        return self.candidates[self._names[index]]

    def unused_parameters(self) -> Iterator[nn.Parameter]:
        """Parameters of the candidates the current path does not run (none in mixture mode, every one unselected)."""
        if self.weights is not None and not self.hard:
            return iter(())
        chosen = self.index if self.weights is None else int(self.weights.detach().argmax())
        used = {id(p) for p in self.candidate(chosen).parameters()} if chosen is not None else set()
        return (p for i in range(len(self.options)) if i != chosen
                for p in self.candidate(i).parameters() if id(p) not in used)

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        if self.weights is not None:
            out = self._mixture(lambda i: self.candidate(i)(*args, **kwargs))
        else:
            out = self.candidate(self._require_index())(*args, **kwargs)
        if self.touch and self.training and torch.is_grad_enabled() and (self.weights is None or self.hard):
            unused = [p.sum() for p in self.unused_parameters() if p.requires_grad]
            if unused:  # 0 * sum(unused): every parameter takes part in the graph, each gets a zero gradient
                out = out + 0.0 * torch.stack(unused).sum()
        return out


class ChoiceInput(Decision):
    """A cell edge whose input is the decision `key`: `forward(inputs)` takes the candidate tensors (a sequence, one
    per option, in the order of `options`) and returns the chosen one, or their mixture."""

    def __init__(self, key: str, options: Sequence[Any]) -> None:
        super().__init__(key, options)

    def forward(self, inputs: Sequence[torch.Tensor]) -> torch.Tensor:
        if len(inputs) != len(self.options):
            raise ValueError(f"ChoiceInput {self.key!r} has {len(self.options)} options, got {len(inputs)} inputs")
        if self.weights is not None:
            return self._mixture(lambda i: inputs[i])
        return inputs[self._require_index()]


class Pick(nn.Module):
    """What an extracted subnet holds in place of a `ChoiceInput`: returns `inputs[index]`."""

    def __init__(self, index: int) -> None:
        super().__init__()
        self.index = index

    def forward(self, inputs: Sequence[torch.Tensor]) -> torch.Tensor:
        return inputs[self.index]

    def extra_repr(self) -> str:
        return f"index={self.index}"
