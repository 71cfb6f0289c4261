"""An ensemble of small MLPs trained together as one batched model, warm-started between fits.

Written in NumPy with its gradients by hand: at these sizes (a few members, tens of units, minibatches of
tens of rows) a training step is ~4x faster than the same model through PyTorch's autograd and optimizer,
whose per-operation overhead dominates. BLAS runs on one thread meanwhile: on matrices this small, more
threads only add synchronisation (30x slower products on a busy 2-core machine).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from itertools import pairwise

import numpy as np
from threadpoolctl import ThreadpoolController  # a dependency of scikit-learn

_BETA1, _BETA2, _EPSILON = 0.9, 0.999, 1e-8  # Adam's defaults (Kingma and Ba, 2015)


@cache
def _threadpools() -> ThreadpoolController:
    return ThreadpoolController()


@contextmanager
def one_thread() -> Iterator[None]:
    """BLAS on one thread inside the block; the caller's setting comes back afterwards."""
    with _threadpools().limit(limits=1, user_api="blas"):
        yield


class MLPEnsemble:
    """`members` independent MLPs (ReLU, two hidden layers of `hidden` units) evaluated in one batched pass.

    Members differ by their initial weights and by the minibatches they train on; the spread of their
    predictions is the model's uncertainty. Weights are drawn from the numpy `rng` given, so that the
    ensemble is as reproducible as the controller that owns it. Trained by Adam on mean squared error,
    with L2 `weight_decay` added to the gradients.
    """

    def __init__(self, inputs: int, *, members: int, hidden: int, rng: np.random.Generator,
                 learning_rate: float, weight_decay: float) -> None:
        sizes = [inputs, hidden, hidden, 1]
        self.params: list[np.ndarray] = []  # weight, bias, weight, bias, weight, bias; each (members, ...)
        for fan_in, fan_out in pairwise(sizes):
            bound = 1.0 / np.sqrt(max(fan_in, 1))
            for shape in ((members, fan_in, fan_out), (members, 1, fan_out)):
                self.params.append(rng.uniform(-bound, bound, shape).astype(np.float32))
        self.moments = [np.zeros_like(p) for p in self.params]
        self.squares = [np.zeros_like(p) for p in self.params]
        self.steps = 0
        self.members, self.learning_rate, self.weight_decay = members, learning_rate, weight_decay

    def _forward(self, x: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
        """x: (members, batch, inputs), or (batch, inputs) shared by all members -> (members, batch), and
        each layer's input for the backward pass."""
        inputs = [x]
        for i in range(0, len(self.params) - 2, 2):
            weight, bias = self.params[i], self.params[i + 1]
            if x.ndim == 2:  # one matrix product for every member at once (a broadcast batch is slow)
                members, fan_in, fan_out = weight.shape
                product = (x @ weight.transpose(1, 0, 2).reshape(fan_in, members * fan_out))
                x = np.ascontiguousarray(product.reshape(len(x), members, fan_out).transpose(1, 0, 2))
            else:
                x = x @ weight
            x += bias  # in place: x is a fresh product
            np.maximum(x, 0.0, out=x)
            inputs.append(x)
        return (x @ self.params[-2] + self.params[-1])[..., 0], inputs

    def fit(self, features: np.ndarray, targets: np.ndarray, *, steps: int, batch_size: int,
            rng: np.random.Generator) -> float:
        """`steps` Adam steps on mean squared error; each member draws its own minibatch (with replacement:
        a bootstrap of all rows while there are at most `batch_size`). Returns the last step's loss."""
        features, targets = features.astype(np.float32, copy=False), targets.astype(np.float32, copy=False)
        n = len(targets)
        loss = 0.0
        with one_thread():
            for _ in range(steps):
                index = rng.integers(0, n, (self.members, min(n, batch_size)))
                loss = self._step(features[index], targets[index])
        return loss

    def gradients(self, x: np.ndarray, y: np.ndarray) -> tuple[float, list[np.ndarray]]:
        """The mean squared error of x: (members, batch, inputs) against y: (members, batch), and its
        gradient with respect to each of `params` (backpropagation by hand)."""
        out, inputs = self._forward(x)
        error = out - y
        grad = (2.0 / error.size) * error[..., None]  # d loss / d output, (members, batch, 1)
        grads: list[np.ndarray] = []
        for layer in range(len(inputs) - 1, -1, -1):
            weight = self.params[2 * layer]
            grads[:0] = [inputs[layer].transpose(0, 2, 1) @ grad, grad.sum(axis=1, keepdims=True)]
            if layer:
                grad = (grad @ weight.transpose(0, 2, 1)) * (inputs[layer] > 0)
        return float((error ** 2).mean()), grads

    def _step(self, x: np.ndarray, y: np.ndarray) -> float:
        loss, grads = self.gradients(x, y)
        self.steps += 1
        step_size = self.learning_rate * np.sqrt(1 - _BETA2 ** self.steps) / (1 - _BETA1 ** self.steps)
        for param, g, moment, square in zip(self.params, grads, self.moments, self.squares):
            g = g + self.weight_decay * param
            moment *= _BETA1
            moment += (1 - _BETA1) * g
            square *= _BETA2
            square += (1 - _BETA2) * g * g
            param -= step_size * moment / (np.sqrt(square) + _EPSILON)
        return loss

    def predict(self, features: np.ndarray) -> np.ndarray:
        """(members, rows) predictions."""
        with one_thread():
            return self._forward(features.astype(np.float32, copy=False))[0]
