"""Zero-cost proxies: scores of an untrained network from one batch, without training (higher = predicted better).

Each proxy is a function `(model, x, y) -> float` on a copy of `model` (the caller's weights, statistics and mode
are left as they were); with a supernet and `config=...` it scores that path (extracted first). Written from the
papers' definitions:

- `synflow` (Tanaka et al. 2020, as a NAS proxy Abdelfattah et al. 2021): every parameter made positive, the input
  all ones, R = sum of the outputs; the score is sum over parameters of theta * dR/dtheta, in double precision,
  batch norm in eval mode (no data enters: `x` only gives the shape);
- `grad_norm` (Abdelfattah et al. 2021): the sum over parameter tensors of the Euclidean norm of the gradient of
  the cross-entropy on the batch;
- `naswot` (Mellor et al. 2021, "Neural Architecture Search without Training"): the binary activation codes c_i of
  every ReLU for each input i (train mode, as built); K[i, j] = number of units where c_i and c_j agree; the score
  is log |det K|;
- `jacob_cov` (the paper's first version, 2020): the Jacobians of the summed outputs w.r.t. each input (eval mode,
  so that they are per input); the score is -sum_k (log(v_k + 1e-5) + 1 / (v_k + 1e-5)) over the eigenvalues v_k
  of their correlation matrix.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from nasplat.core.registry import Registry
from nasplat.oneshot.supernet import decisions, extract

Proxy = Callable[..., float]


def _copy(model: nn.Module, config: Mapping[str, Any] | None) -> nn.Module:
    """The network to score: the path `config` of a supernet, or a copy of `model` (a plain module, or a supernet
    on its current path)."""
    if config is not None or decisions(model):
        return extract(model, config)
    return copy.deepcopy(model)


def synflow(model: nn.Module, x: torch.Tensor, y: torch.Tensor | None = None, *,
            config: Mapping[str, Any] | None = None) -> float:
    """Synaptic flow: sum(theta * dR/dtheta) with |theta| and an all-ones input (shape of one `x`), R = sum(output)."""
    net = _copy(model, config).double().eval()
    with torch.no_grad():
        for p in net.parameters():
            p.abs_()
    for p in net.parameters():
        p.requires_grad_(True)
    net.zero_grad(set_to_none=True)
    ones = torch.ones((1, *x.shape[1:]), dtype=torch.float64, device=x.device)
    net(ones).sum().backward()
    return float(sum((p.detach() * p.grad).sum().item() for p in net.parameters() if p.grad is not None))


def grad_norm(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, config: Mapping[str, Any] | None = None) -> float:
    """Sum of the gradient norms (one per parameter tensor) of the batch's cross-entropy, in train mode."""
    net = _copy(model, config).train()
    for p in net.parameters():
        p.requires_grad_(True)
    net.zero_grad(set_to_none=True)
    F.cross_entropy(net(x), y).backward()
    return float(sum(p.grad.norm() for p in net.parameters() if p.grad is not None))


def activation_kernel(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """NASWOT's kernel of `model` on `x`: K[i, j] = units of all ReLUs (`nn.ReLU` modules) where the binary codes of
    inputs i and j agree (both active or both inactive). In train mode, without gradients, on `model` itself."""
    n = len(x)
    kernel = torch.zeros(n, n, dtype=torch.float64, device=x.device)

    def hook(module: nn.Module, inputs: Any, output: torch.Tensor) -> None:
        codes = (output.detach().reshape(n, -1) > 0).double()
        kernel.add_(codes @ codes.T + (1 - codes) @ (1 - codes).T)

    handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, nn.ReLU)]
    try:
        with torch.no_grad():
            model.train()
            model(x)
    finally:
        for handle in handles:
            handle.remove()
    return kernel


def naswot(model: nn.Module, x: torch.Tensor, y: torch.Tensor | None = None, *,
           config: Mapping[str, Any] | None = None) -> float:
    """log |det K| of the activation-pattern kernel (`activation_kernel`): how differently the untrained network
    separates the inputs of the batch (-inf if two inputs share their codes, or without ReLUs)."""
    kernel = activation_kernel(_copy(model, config), x)
    return float(torch.linalg.slogdet(kernel).logabsdet)


def jacob_cov(model: nn.Module, x: torch.Tensor, y: torch.Tensor | None = None, *,
              config: Mapping[str, Any] | None = None) -> float:
    """The Jacobian-covariance score: -sum(log(v + k) + 1/(v + k)), v the eigenvalues of the correlation matrix of
    the per-input Jacobians d(sum of outputs)/d(input), k = 1e-5 (Mellor et al. 2020)."""
    net = _copy(model, config).eval()  # batch norm by its running statistics: each output depends on its input only
    inputs = x.detach().clone().requires_grad_(True)
    net(inputs).sum().backward()
    if inputs.grad is None:
        raise ValueError("jacob_cov: the model's output does not depend on its input, so it has no Jacobian")
    jacobians = inputs.grad.reshape(len(x), -1).double()
    correlation = torch.nan_to_num(torch.corrcoef(jacobians))
    eigenvalues = torch.linalg.eigvalsh(correlation).clamp_min(0.0)
    k = 1e-5
    return float(-(torch.log(eigenvalues + k) + 1.0 / (eigenvalues + k)).sum())


PROXIES: Registry[Proxy] = Registry("zero-cost proxy", {"synflow": synflow, "grad_norm": grad_norm,
                                                        "naswot": naswot, "jacob_cov": jacob_cov})
"""The proxies by name."""


def score(name: str, model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, config: Mapping[str, Any] | None = None,
          seed: int | None = 0) -> float:
    """The proxy `name` of `model` (or of its path `config`) on the batch `x`, `y`; `seed` seeds torch's generator
    first (None: left as is) so that the score is a function of its arguments."""
    proxy = PROXIES.lookup(name)
    if seed is not None:
        torch.manual_seed(seed)
    return proxy(model, x, y, config=config)
