"""An ensemble of small MLPs, trained together as one batched PyTorch model, warm-started between fits."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch
from torch import nn


@contextmanager
def one_thread() -> Iterator[None]:
    """Run torch on one intra-op thread: for models this small, more threads only add synchronisation
    (25x slower per step on a busy 2-core machine); the caller's setting comes back afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class MLPEnsemble(nn.Module):
    """`members` independent MLPs (ReLU, two hidden layers of `hidden` units) evaluated in one batched pass.

    Members differ by their initial weights and by the minibatches they train on; the spread of their
    predictions is the model's uncertainty. Weights are drawn from the numpy `rng` given, so that the
    ensemble is as reproducible as the controller that owns it.
    """

    def __init__(self, inputs: int, *, members: int, hidden: int, rng: np.random.Generator,
                 learning_rate: float, weight_decay: float) -> None:
        super().__init__()
        sizes = [inputs, hidden, hidden, 1]
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
            bound = 1.0 / np.sqrt(max(fan_in, 1))
            self.weights.append(nn.Parameter(torch.from_numpy(
                rng.uniform(-bound, bound, (members, fan_in, fan_out)).astype(np.float32))))
            self.biases.append(nn.Parameter(torch.from_numpy(
                rng.uniform(-bound, bound, (members, 1, fan_out)).astype(np.float32))))
        self.members = members
        self.optimizer = torch.optim.Adam(self.parameters(), lr=learning_rate, weight_decay=weight_decay, foreach=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (members, batch, inputs) -> (members, batch)."""
        last = len(self.weights) - 1
        for i, (w, b) in enumerate(zip(self.weights, self.biases)):
            x = torch.baddbmm(b, x, w)
            if i < last:
                x = torch.relu(x)
        return x.squeeze(-1)

    def fit(self, features: np.ndarray, targets: np.ndarray, *, steps: int, batch_size: int,
            rng: np.random.Generator) -> float:
        """`steps` Adam steps on mean squared error; each member draws its own minibatches. Returns the last loss."""
        with one_thread():
            return self._fit(features, targets, steps, batch_size, rng)

    def _fit(self, features: np.ndarray, targets: np.ndarray, steps: int, batch_size: int,
             rng: np.random.Generator) -> float:
        x_all, y_all = torch.from_numpy(features), torch.from_numpy(targets.astype(np.float32))
        n = len(targets)
        loss = torch.zeros(())
        for _ in range(steps):
            if n <= batch_size:
                index = torch.from_numpy(rng.integers(0, n, (self.members, n)))  # a bootstrap per member
            else:
                index = torch.from_numpy(rng.integers(0, n, (self.members, batch_size)))
            loss = ((self(x_all[index]) - y_all[index]) ** 2).mean()
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
        return float(loss.detach())

    @torch.no_grad()
    def predict(self, features: np.ndarray) -> np.ndarray:
        """(members, rows) predictions."""
        x = torch.from_numpy(features).unsqueeze(0).expand(self.members, -1, -1)
        with one_thread():
            return self(x).numpy()
