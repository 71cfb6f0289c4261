"""Asynchronous model-based multi-fidelity search (after MOBSTER, Klein et al. 2020): a Gaussian process over
(config, fidelity) learned from every rung of every trial, proposing into a scheduler (ASHA, Hyperband) by
expected improvement at the highest fidelity (scikit-learn's `GaussianProcessRegressor` over the `Encoder`
features of a config and the log of the step it was measured at)."""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np

from nasplat.controllers.base import Controller, Result, TrialSpec
from nasplat.controllers.surrogate.encoding import Encoder, Pool, refill_pool
from nasplat.core.checks import check_choice, check_int, check_real
from nasplat.space import Config, Space
from nasplat.space.domains import config_key, copy_config


class ModelBasedMultiFidelity(Controller):
    """Proposes configs by a model of the metric over (config, fidelity), for a scheduler to run (MOBSTER).

    `initial_configs` (each validated by the space) are proposed first, in their order. It learns from every rung
    every trial reaches (`on_rung`: paused, stopped, promoted and completed trials alike; wrapped in no scheduler,
    from each trial's last report by `tell`), one observation per (trial, step). The first `initial_samples`
    trials are random, and so is a share `random_fraction` of the later ones (drawn from its seeded stream).
    Otherwise each `ask`:

    1. fits a Gaussian process (scikit-learn's, Matern 5/2 with one length scale per input, plus white noise) to
       the maximised scores over the config's encoding and log(step); the kernel's hyperparameters are fitted
       again (from their last values) once `refit_every` new observations, and a quarter more than at the last
       fit, have arrived (so about logarithmically often), and kept in between. At most `max_points`
       observations train it, the highest fidelities first (then the latest): an `ask`'s cost stays bounded;
    2. conditions it on the trials still running without an observation (their configs at the target fidelity,
       at the model's mean: the "kriging believer"), so that several workers do not get the same region;
    3. gathers candidates: a pool of `pool_size` random configs (drawn once, topped up as they are proposed),
       every neighbour (`Space.neighbours`) of the `num_parents` configs with the best predicted score and
       `mutations` mutations of them, leaving out every config within `min_distance` (default 0: none;
       Euclidean, in the encoding: each number in [0, 1], each choice one-hot) of one proposed before: a near
       copy of the incumbent adds a trial and little knowledge;
    4. proposes the candidate with the highest expected improvement at the target fidelity over the best
       predicted score of an observed config there. The target fidelity is the highest step observed at least
       `min_at_target` times (the lowest observed while none is), at most `max_steps`: as BOHB's model, judged
       where the data are rather than extrapolated to a fidelity few trials reached.

    `fit_on="target"` fits the model to the observations at the target fidelity and above only (the lower ones
    still decide the target), as BOHB fits its model at one budget, for spaces whose first rungs rank the good
    configs unlike the end; `"all"` (the default) fits every fidelity.

    Once every config of a finite space was proposed, it proposes again (`revisit`, `train_to_end`) the config
    with the best predicted score among those no trial trained as far as the furthest, each once: a config the
    rungs stopped early may still be the best at the end.

    `warm_start` proposes an earlier experiment's incumbents again first, `train_to_end` (a scheduler runs them to
    the end: the earlier run judged them at its rungs already).
    """

    def __init__(self, space: Space | Mapping[str, Any], *, initial_samples: int = 10, max_steps: int | None = None,
                 max_points: int = 128, refit_every: int = 10, pool_size: int = 500, num_parents: int = 3,
                 mutations: int = 20, random_fraction: float = 0.0, min_at_target: int = 3,
                 min_distance: float = 0.0, fit_on: Literal["all", "target"] = "all",
                 initial_configs: Sequence[Config] = (), **kwargs: Any) -> None:
        super().__init__(space, **kwargs)
        for config in initial_configs:
            self.space.validate(config)
        self.initial_configs = [copy_config(c) for c in initial_configs]
        for name, value, low in (("initial_samples", initial_samples, 1), ("max_points", max_points, 2),
                                 ("refit_every", refit_every, 1), ("pool_size", pool_size, 1),
                                 ("num_parents", num_parents, 0), ("mutations", mutations, 0),
                                 ("min_at_target", min_at_target, 1)):
            check_int(name, value, minimum=low)
        check_int("max_steps", max_steps, minimum=1, optional=True)
        check_real("random_fraction", random_fraction, minimum=0, maximum=1)
        self.min_distance = check_real("min_distance", min_distance, minimum=0)
        self.fit_on = check_choice("fit_on", fit_on, ("all", "target"))
        self.initial_samples, self.max_steps, self.max_points = initial_samples, max_steps, max_points
        self.refit_every, self.pool_size, self.num_parents = refit_every, pool_size, num_parents
        self.mutations, self.random_fraction = mutations, float(random_fraction)
        self.min_at_target = min_at_target
        self.user_configs = len(self.initial_configs)  # those after them are a warm start's incumbents
        self.encoder = Encoder(self.space)
        self.configs: dict[int, Config] = {}  # trial -> its config
        self.encodings: dict[int, np.ndarray] = {}  # trial -> its config's encoding
        self.pool: Pool = ([], [], np.zeros((0, self.encoder.size)))
        self.seen: set[Any] = set()  # keys of every config proposed
        self.observed: dict[tuple[int, int], float] = {}  # (trial, step) -> maximised score, in order of arrival
        self.pending: set[int] = set()  # trials proposed and not yet observed
        self.revisited: set[Any] = set()  # keys of the configs `revisit` proposed again
        self.kernel: Any = None  # the fitted kernel (hyperparameters), None before the first fit
        self.fitted_at = 0  # observations when the hyperparameters were last fitted

    # -- learning ---------------------------------------------------------------------------------------------
    def on_rung(self, trial_id: int, result: Result) -> None:
        """A rung's report: one more observation of the trial's config at fidelity `result.step`."""
        self._observe(trial_id, result)

    def tell(self, trial_id: int, result: Result) -> None:
        """A trial ended: its last report is an observation too (once per step), a failure is recorded."""
        score = self._score_of(trial_id, result)
        if score is not None:
            self._observe(trial_id, result, score)
        self.pending.discard(trial_id)

    def _observe(self, trial_id: int, result: Result, score: float | None = None) -> None:
        score = self.score(result) if score is None else score
        if score is None or trial_id not in self.configs or result.step < 1:
            return
        self.observed.setdefault((trial_id, int(result.step)), score)
        self.pending.discard(trial_id)

    def warm_start(self, results: Sequence[tuple[Config, Result]]) -> None:
        """An earlier experiment's results become observations (of trials numbered -1, -2, ...), and its
        `num_parents` best configs (the furthest trained first, then by score there) are proposed again first,
        after `initial_configs`, so that the search starts from the earlier incumbents."""
        trials: dict[Any, int] = {}
        for config, result in results:
            score = self.score(result)
            if score is None or result.step < 1:
                continue
            key = config_key(config)
            if key not in trials:
                trials[key] = -1 - len(trials)
                self.configs[trials[key]] = copy_config(config)
                self.encodings[trials[key]] = self.encoder.encode(config).astype(float)
            self.observed[(trials[key], int(result.step))] = score
        furthest: dict[int, tuple[int, float]] = {}
        for (trial_id, step), score in self.observed.items():
            if trial_id < 0:
                furthest[trial_id] = max(furthest.get(trial_id, (0, -np.inf)), (step, score))
        best = sorted(furthest, key=lambda t: (-furthest[t][0], -furthest[t][1], -t))[:self.num_parents]
        self.initial_configs += [copy_config(self.configs[t]) for t in best]

    # -- proposing --------------------------------------------------------------------------------------------
    def ask(self) -> TrialSpec:
        if self.next_trial_id < len(self.initial_configs):  # the user's configs first, in their order
            return self._remember(copy_config(self.initial_configs[self.next_trial_id]),
                                  train_to_end=self.next_trial_id >= self.user_configs)
        explore = self.random_fraction > 0 and self.rng.random() < self.random_fraction
        if len(self.observed) < self.initial_samples or explore:
            return self._remember(self.space.sample_unseen(self.rng, self.seen))
        from sklearn.gaussian_process import GaussianProcessRegressor  # noqa: F401  (loads scipy's BLAS first)
        from threadpoolctl import threadpool_limits  # a dependency of scikit-learn

        # BLAS on one thread: on matrices this small more threads only add synchronisation (a 250 x 250 Cholesky
        # took 0.1-0.3 s on two threads of a busy machine, 3 ms on one); the libraries loaded now, scipy's included
        with threadpool_limits(limits=1, user_api="blas"):
            return self._propose_by_model()

    def _propose_by_model(self) -> TrialSpec:
        model, target, trained = self._fit()
        configs, encoded = self.candidates(model, target, trained)
        if not configs:  # every config of a finite space proposed
            again = self.revisit(model)
            if again is not None:
                self.revisited.add(config_key(again))
                return self._remember(copy_config(again), train_to_end=True)
            return self._remember(self.space.sample_unseen(self.rng, self.seen))
        mean, std = model.predict(_at(encoded, target), return_std=True)
        incumbent = float(np.max(model.predict(_at(self._encoded(trained), target))))
        return self._remember(copy_config(configs[int(np.argmax(expected_improvement(mean, std, incumbent)))]))

    def revisit(self, model: Any) -> Config | None:
        """Once every config of a finite space was proposed: the one with the best predicted score at the highest
        step observed among those that no trial reached it with, none is running and `revisit` did not give
        before (to train to the end, past the rungs that judged it); None when there is none."""
        top = max(step for _, step in self.observed)
        reached = set(self.revisited)  # keys of the configs a trial took to `top` (or that is running, unreported)
        reached.update(config_key(self.configs[trial]) for trial in self.pending)
        reached.update(config_key(self.configs[trial]) for trial, step in self.observed if step >= top)
        proposed: dict[Any, Config] = {}  # each config proposed (or warm-started from), once, in trial order
        for config in self.configs.values():
            proposed.setdefault(config_key(config), config)
        configs = [config for key, config in proposed.items() if key not in reached]
        if not configs:
            return None
        return configs[int(np.argmax(model.predict(_at(self.encoder.encode_many(configs), top))))]

    def target(self) -> int:
        """The fidelity proposals are judged at: the highest step (at most `max_steps`) observed at least
        `min_at_target` times, else the lowest step observed."""
        counts: dict[int, int] = {}
        for _, step in self.observed:
            counts[step] = counts.get(step, 0) + 1
        steps = [s for s, n in counts.items() if n >= self.min_at_target]
        target = max(steps) if steps else min(counts)
        return min(target, self.max_steps) if self.max_steps else target

    def candidates(self, model: Any, target: int, trained: list[int]) -> tuple[list[Config], np.ndarray]:
        """Unproposed configs with their encodings: the random pool (drawn once, topped up to `pool_size` as its
        configs are proposed), and the neighbours and mutations of the `num_parents` configs among `trained`
        with the best predicted score at `target`."""
        parents: list[Config] = []
        if self.num_parents and trained:
            predicted = model.predict(_at(self._encoded(trained), target))
            parents = [self.configs[trained[i]] for i in np.argsort(-predicted, kind="stable")[:self.num_parents]]
        local = [c for parent in parents for c in self.space.neighbours(parent, self.rng)]
        local += [self.space.mutate(parents[i % len(parents)], self.rng) for i in range(self.mutations)] if (
            parents) else []
        keys, configs, rows = self._top_up_pool()
        taken = set(self.seen)  # each candidate once, and none proposed before (a small space's pool repeats)
        picked = [local[i] for i in _first_unseen([config_key(c) for c in local], taken)]
        unproposed = _first_unseen(keys, taken)  # indices of the pool's candidates
        encoded = np.vstack([self.encoder.encode_many(picked), rows[unproposed]]) if picked else rows[unproposed]
        candidates = picked + [configs[i] for i in unproposed]
        if self.min_distance > 0 and self.encodings and len(candidates):
            proposed = np.vstack(list(self.encodings.values()))
            far = _min_distances(encoded.astype(float), proposed) > self.min_distance
            candidates, encoded = [c for c, keep in zip(candidates, far) if keep], encoded[far]
        return candidates, encoded

    def _top_up_pool(self) -> Pool:
        self.pool = refill_pool(self.pool, self.seen, self.pool_size, self.encoder, self.rng)
        return self.pool

    def _encoded(self, trials: list[int]) -> np.ndarray:
        return np.vstack([self.encodings[t] for t in trials])

    def training_set(self) -> tuple[np.ndarray, np.ndarray, list[int]]:
        """The model's inputs and maximised scores, and the trials they come from: at most `max_points`
        observations (with `fit_on="target"`, of those at the target fidelity and above), the highest fidelities
        first, then the latest."""
        rows = list(self.observed.items())
        if self.fit_on == "target":
            target = self.target()
            rows = [row for row in rows if row[0][1] >= target]
        order = sorted(range(len(rows)), key=lambda i: (-rows[i][0][1], -i))[:self.max_points]
        chosen = [rows[i] for i in sorted(order)]
        trials = [trial for (trial, _), _ in chosen]
        inputs = np.hstack([self._encoded(trials), np.log([[step] for (_, step), _ in chosen])])
        return inputs, np.array([score for _, score in chosen]), sorted(set(trials))

    def _fit(self) -> tuple[Any, int, list[int]]:
        """The model conditioned on the observations and on the pending trials' believed scores (its
        hyperparameters fitted again when due), the target fidelity, and the trials it was trained on."""
        from sklearn.gaussian_process import GaussianProcessRegressor
        from sklearn.gaussian_process.kernels import ConstantKernel, Matern, WhiteKernel

        inputs, scores, trained = self.training_set()
        target = self.target()
        refit = self.kernel is None or len(self.observed) - self.fitted_at >= max(self.refit_every,
                                                                                 self.fitted_at // 4)
        if self.kernel is None:
            self.kernel = (ConstantKernel(1.0, (1e-2, 1e2)) * Matern(np.ones(inputs.shape[1]), (1e-2, 1e2), nu=2.5)
                           + WhiteKernel(1e-2, (1e-6, 1.0)))
        model = GaussianProcessRegressor(self.kernel, normalize_y=True, optimizer="fmin_l_bfgs_b" if refit else None)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # hyperparameters at their bounds (one-hot columns never varied)
            model.fit(inputs, scores)
        if refit:
            self.kernel, self.fitted_at = model.kernel_, len(self.observed)
        pending = sorted(self.pending)
        if pending:
            believed_at = _at(self._encoded(pending), target)
            believed = model.predict(believed_at)
            model = GaussianProcessRegressor(self.kernel, normalize_y=True, optimizer=None)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model.fit(np.vstack([inputs, believed_at]), np.concatenate([scores, believed]))
        return model, target, trained

    def _remember(self, config: Config, train_to_end: bool = False) -> TrialSpec:
        self.seen.add(config_key(config))
        spec = self._propose(config, train_to_end=train_to_end)
        self.configs[spec.trial_id] = copy_config(config)
        self.encodings[spec.trial_id] = self.encoder.encode(config).astype(float)
        self.pending.add(spec.trial_id)
        return spec


def _first_unseen(keys: Sequence[Any], taken: set[Any]) -> list[int]:
    """The indices of the keys not in `taken`, the first of each only; `taken` gains them."""
    indices = []
    for index, key in enumerate(keys):
        if key not in taken:
            taken.add(key)
            indices.append(index)
    return indices


def _min_distances(points: np.ndarray, others: np.ndarray) -> np.ndarray:
    """Each point's Euclidean distance to the nearest of `others`."""
    squared = (points * points).sum(axis=1)[:, None] - 2 * points @ others.T + (others * others).sum(axis=1)[None, :]
    return np.sqrt(np.maximum(squared.min(axis=1), 0.0))


def _at(encoded: np.ndarray, step: int) -> np.ndarray:
    """Encoded configs with the fidelity column: log(step)."""
    return np.hstack([encoded.astype(float), np.full((len(encoded), 1), math.log(step))])


def expected_improvement(mean: np.ndarray, std: np.ndarray, best: float) -> np.ndarray:
    """E[max(f - best, 0)] for f ~ N(mean, std^2), elementwise (the improvement itself where std is 0)."""
    from scipy.special import ndtr  # scipy comes with scikit-learn

    std = np.maximum(std, 1e-12)
    z = (mean - best) / std
    return (mean - best) * ndtr(z) + std * np.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)
