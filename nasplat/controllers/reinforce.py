"""REINFORCE (Williams, 1992) over the space's encoded decisions, with a moving-average baseline."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from nasplat.controllers.base import Controller, Result, TrialSpec
from nasplat.core.checks import check_real
from nasplat.space import MAX_ATTEMPTS, Config, ForbiddenConfigError, Space


class Reinforce(Controller):
    """A factorised categorical policy, one softmax per token of `Space.encode`.

    The reward is the raw metric (negated for `mode="min"`), not rescaled. After each result the logits move
    by exactly `learning_rate * (reward - baseline) * grad log p(tokens)`, with the baseline as it stood
    before this result; then the baseline, an exponential moving average of rewards with decay
    `baseline_decay`, takes the reward in. The first reward only sets the baseline (its advantage is 0).
    In a space with rules, a draw whose config is forbidden is redrawn from the policy.
    """

    def __init__(self, space: Space | Mapping[str, Any], *, learning_rate: float = 0.05,
                 baseline_decay: float = 0.9, **kwargs: Any) -> None:
        super().__init__(space, **kwargs)
        check_real("learning_rate", learning_rate, minimum=0, strict=True)
        check_real("baseline_decay", baseline_decay, minimum=0, maximum=1, strict_maximum=True)
        self.learning_rate, self.baseline_decay = learning_rate, baseline_decay
        self.logits = [np.zeros(n) for n in self.space.cardinalities()]
        self.baseline: float | None = None
        self.pending: dict[int, list[int]] = {}

    def probabilities(self) -> list[np.ndarray]:
        """The policy's current distribution at each token position."""
        out = []
        for logits in self.logits:
            p = np.exp(logits - logits.max())
            out.append(p / p.sum())
        return out

    def ask(self) -> TrialSpec:
        cumulative = [np.cumsum(p) for p in self.probabilities()]
        for _ in range(MAX_ATTEMPTS):
            tokens, config = self._draw(cumulative)
            if self.space.allows(config):
                spec = self._propose(config)
                self.pending[spec.trial_id] = tokens
                return spec
        raise ForbiddenConfigError(f"REINFORCE: {MAX_ATTEMPTS} configs drawn from the policy in a row were forbidden "
                                   f"by the space's rules {sorted(self.space.forbidden)}")

    def _draw(self, cumulative: list[np.ndarray]) -> tuple[list[int], Config]:
        draws = self.rng.random(len(self.logits))  # one inverse-CDF draw per position
        tokens = [min(int(np.searchsorted(c, u, side="right")), len(c) - 1) for c, u in zip(cumulative, draws)]
        return tokens, self.space.decode(tokens)

    def tell(self, trial_id: int, result: Result) -> None:
        reward = self._score_of(trial_id, result)
        tokens = self.pending.pop(trial_id, None)
        if tokens is None or reward is None:
            return
        advantage = 0.0 if self.baseline is None else reward - self.baseline
        for logits, p, token in zip(self.logits, self.probabilities(), tokens):
            grad = -p
            grad[token] += 1.0
            logits += self.learning_rate * advantage * grad
        self.baseline = reward if self.baseline is None else (
            self.baseline_decay * self.baseline + (1.0 - self.baseline_decay) * reward)
