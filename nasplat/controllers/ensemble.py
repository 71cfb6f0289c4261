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
        chunks: list[np.ndarray] = []
        self.shapes: list[tuple[int, ...]] = []  # weight, bias, weight, bias, ... as views of one flat tensor
        for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
            bound = 1.0 / np.sqrt(max(fan_in, 1))
            for shape in ((members, fan_in, fan_out), (members, 1, fan_out)):
                chunks.append(rng.uniform(-bound, bound, shape).astype(np.float32).ravel())
                self.shapes.append(shape)
        # One flat parameter: an Adam step is a handful of tensor operations instead of a handful per layer.
        self.flat = nn.Parameter(torch.from_numpy(np.concatenate(chunks)))
        self.members = members
        self.optimizer = torch.optim.Adam([self.flat], lr=learning_rate, weight_decay=weight_decay)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (members, batch, inputs) -> (members, batch)."""
        tensors, offset = [], 0
        for shape in self.shapes:
            size = int(np.prod(shape))
            tensors.append(self.flat[offset:offset + size].view(shape))
            offset += size
        layers = len(tensors) // 2
        for i in range(layers):
            x = torch.baddbmm(tensors[2 * i + 1], x, tensors[2 * i])
            if i < layers - 1:
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
