"""The toy problem of the PBT paper (Jaderberg et al., 2017, Fig. 2).

Maximise Q(θ) = 1.2 − (θ0² + θ1²), but each member only sees the surrogate Q̂(θ|h) = 1.2 − (h0·θ0² + h1·θ1²)
and ascends its gradient: θ ← θ + lr · (−2 h ⊙ θ). θ starts at (0.9, 0.9). A member with h = (1, 0) only
shrinks θ0 and one with h = (0, 1) only θ1, so alone neither gets past Q = 1.2 − 0.81 = 0.39; PBT
copies θ from the better member and perturbs h, and the population reaches Q ≈ 1.2.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from nasplat.space import Config, Float, Space
from nasplat.trainer import Trainer, WorkerContext

space = Space({"h0": Float(0.0, 1.0), "h1": Float(0.0, 1.0), "lr": 0.05})
MEMBERS = [{"h0": 1.0, "h1": 0.0, "lr": 0.05}, {"h0": 0.0, "h1": 1.0, "lr": 0.05}]


def q(theta: np.ndarray) -> float:
    """The true objective."""
    return 1.2 - float(np.sum(theta ** 2))


class PBTToy(Trainer):
    """One gradient-ascent step on the surrogate per `step()`; reports Q, Q̂ and θ."""

    def setup(self, config: Config, ctx: WorkerContext) -> None:
        self.h = np.array([config["h0"], config["h1"]], dtype=float)
        self.lr = float(config["lr"])
        self.theta = np.array([0.9, 0.9])

    def step(self) -> dict[str, Any]:
        self.theta = self.theta + self.lr * (-2.0 * self.h * self.theta)
        return {"Q": q(self.theta), "Q_hat": 1.2 - float(np.sum(self.h * self.theta ** 2)),
                "theta0": float(self.theta[0]), "theta1": float(self.theta[1])}

    def state_dict(self) -> dict[str, Any]:
        return {"theta": self.theta.copy()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.theta = np.array(state["theta"], dtype=float)

    def update_config(self, config: Config) -> None:
        self.h = np.array([config["h0"], config["h1"]], dtype=float)
        self.lr = float(config["lr"])
