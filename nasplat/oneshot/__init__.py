"""Weight-sharing NAS: supernets whose layers are decisions of a nasplat space, trained one path at a time.

- `layers`: `ChoiceLayer` (a layer's operation is a decision), `ChoiceInput` (an edge's input is one);
- `supernet`: `Supernet` (`space()`, `select(config)`, `extract(config)`, `mix(weights)`) and the same as functions;
- `sampling`: which path each batch trains: `UniformSampler` (SPOS), `FairSampler` (FairNAS), seeded by step;
- `evaluation`: `evaluate_path` (inherited weights, recalibrated batch norm), `measure`, `recalibrate_bn`;
- `training`: `train_epoch`, `OneShotTrainer` (what the one-shot trials share), `SupernetTrainer`;
- `darts`: gradient-based search (DARTS first order, GDAS) and `DartsTrainer`;
- `proxies`: zero-cost scores of an untrained network (synflow, grad_norm, NASWOT, Jacobian covariance);
- `search`: searches over one trained supernet: `SharedWeights` (published once), `PathTrainer`, `ProxyTrainer`,
  `ProxyFeatures` (proxies as the predictor's inputs), `search_trainer`.

Every name below is importable from `nasplat.oneshot`; the trainers need a data set and a supernet of their own
(`trainers.supernet` has them for the NAS-Bench-201 cell of `search_spaces.nb201_supernet` on MNIST-1D).
"""

from nasplat.oneshot.darts import METHODS, ArchitectureWeights, DartsTrainer, alpha_table, tau_at
from nasplat.oneshot.evaluation import evaluate_path, measure, recalibrate_bn
from nasplat.oneshot.layers import ChoiceInput, ChoiceLayer, Decision, Pick
from nasplat.oneshot.proxies import PROXIES, grad_norm, jacob_cov, naswot, score, synflow
from nasplat.oneshot.sampling import SAMPLERS, FairSampler, PathSampler, UniformSampler, make_sampler
from nasplat.oneshot.search import PathTrainer, ProxyFeatures, ProxyTrainer, SharedWeights, search_trainer
from nasplat.oneshot.supernet import (
    Supernet,
    check_same_decisions,
    drop_unused_grads,
    extract,
    mix,
    select,
    selected,
    set_touch,
    space_of,
    unused_parameters,
)
from nasplat.oneshot.training import OneShotTrainer, SupernetTrainer, train_epoch

__all__ = [
    "METHODS", "PROXIES", "SAMPLERS", "ArchitectureWeights", "ChoiceInput", "ChoiceLayer", "DartsTrainer", "Decision",
    "FairSampler", "OneShotTrainer", "PathSampler", "PathTrainer", "Pick", "ProxyFeatures", "ProxyTrainer",
    "SharedWeights", "Supernet",
    "SupernetTrainer", "UniformSampler", "alpha_table", "check_same_decisions", "drop_unused_grads", "evaluate_path",
    "extract", "grad_norm", "jacob_cov", "make_sampler", "measure", "mix", "naswot", "recalibrate_bn", "score",
    "search_trainer", "select", "selected", "set_touch", "space_of", "synflow", "tau_at", "train_epoch",
    "unused_parameters",
]
