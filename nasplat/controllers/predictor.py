"""Predictor-guided search (after BANANAS, White, Neiswanger and Savani, AAAI 2021).

An ensemble of small neural networks learns the metric from every result; candidates are the neighbours
and mutations of the current climb's best configs and a pool of random configs; the next trial is the
candidate with the best independent Thompson sample of the ensemble's prediction. A climb that stops
improving restarts from the pool.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from statistics import NormalDist
from typing import Any

import numpy as np

from nasplat.controllers.base import Controller, Result, TrialSpec
from nasplat.controllers.surrogate.encoding import Encoder, Pool, refill_pool
from nasplat.controllers.surrogate.ensemble import MLPEnsemble
from nasplat.core.checks import check_int, check_real
from nasplat.space import Config, Space
from nasplat.space.domains import config_key, copy_config, random_index


class Predictor(Controller):
    """Model-guided search over any space (categorical, integer, float, conditional, constrained).

    The first `initial_samples` trials are random. After that each `ask`:

    1. warm-starts the ensemble (`ensemble_size` MLPs over `Encoder` features) with `fit_steps` Adam steps
       per result that arrived since the last fit (at most `max_fit_steps`), on minibatches of `batch_size`:
       the cost of an `ask` does not grow with the number of results;
    2. gathers candidates: every neighbour (`Space.neighbours`) of the `num_parents` best configs of the
       current climb, `mutations` double mutations of them and a pool of `pool_size` random configs (drawn
       once, topped up as they are proposed), leaving out every config already proposed, pending trials
       included (so many workers never get the same config);
    3. proposes the candidate with the highest independent Thompson sample: for each candidate,
       mean + std * z over the ensemble's predictions, z a fresh standard normal draw.

    A climb ends when `patience` results in a row fail to beat its best (a local optimum the model cannot
    see past); the next climb keeps the model and every result but starts with no parents, from the pool's
    most promising configs, so that it can settle in another basin. The search's best is over all climbs.
    `patience=None` never restarts.

    The model learns the ranks of the scores (normal scores of the ranks), so outliers such as broken
    networks do not dominate the fit. `features` (a function of a config to numbers, e.g. `nasplat.oneshot.ProxyFeatures`, zero-cost proxies of the untrained path) adds
    inputs to the model beside the config's encoding; it must be deterministic (a resume replays the search).
    """

    def __init__(self, space: Space | Mapping[str, Any], *, initial_samples: int = 30, ensemble_size: int = 5,
                 hidden: int = 32, fit_steps: int = 20, max_fit_steps: int = 200, batch_size: int = 64,
                 learning_rate: float = 0.01, weight_decay: float = 1e-4, num_parents: int = 3, mutations: int = 50,
                 pool_size: int = 1000, patience: int | None = 20,
                 features: Callable[[Config], Sequence[float]] | None = None, **kwargs: Any) -> None:
        super().__init__(space, **kwargs)
        for name, value, low in (("initial_samples", initial_samples, 1), ("ensemble_size", ensemble_size, 2),
                                 ("hidden", hidden, 1), ("fit_steps", fit_steps, 1),
                                 ("max_fit_steps", max_fit_steps, 1), ("batch_size", batch_size, 1),
                                 ("num_parents", num_parents, 1), ("mutations", mutations, 0),
                                 ("pool_size", pool_size, 0)):
            check_int(name, value, minimum=low)
        check_int("patience", patience, minimum=1, optional=True)
        check_real("learning_rate", learning_rate, minimum=0, maximum=1, strict=True, strict_maximum=True)
        check_real("weight_decay", weight_decay, minimum=0, maximum=1, strict_maximum=True)
        self.initial_samples, self.num_parents, self.mutations = initial_samples, num_parents, mutations
        self.pool_size, self.patience = pool_size, patience
        self.fit_steps, self.max_fit_steps, self.batch_size = fit_steps, max_fit_steps, batch_size
        if features is not None and not callable(features):
            raise ValueError(f"`features` must be a function of a config to numbers (or None), got {features!r}")
        self.encoder = Encoder(self.space, features)
        self.model = MLPEnsemble(self.encoder.size, members=ensemble_size, hidden=hidden, rng=self.rng,
                                 learning_rate=learning_rate, weight_decay=weight_decay)
        self.seen: set[Any] = set()  # keys of every config proposed
        self.pending: dict[int, tuple[int, Config]] = {}  # trial -> (its climb, its config)
        self.configs: list[Config] = []  # every scored config, in order of arrival
        self.features = np.zeros((0, self.encoder.size), dtype=np.float32)
        self.scores = np.zeros(0)
        self.unfitted = 0  # results that arrived since the last fit
        self.around: dict[Any, tuple[list[Any], list[Config], np.ndarray]] = {}  # neighbourhoods of the best
        self.pool: Pool = ([], [], np.zeros((0, self.encoder.size), np.float32))
        self.climb = 0  # restarts so far
        self.climb_members: list[int] = []  # indices into `configs` of the current climb's results
        self.stale = 0  # results in a row that did not beat the current climb's best

    def ask(self) -> TrialSpec:
        if len(self.scores) < self.initial_samples:
            return self._remember(self.space.sample_unseen(self.rng, self.seen))
        self._fit()
        candidates, features = self.candidates()
        if not candidates:  # the neighbourhood of the best and the pool are exhausted: explore
            return self._remember(self.space.sample_unseen(self.rng, self.seen))
        predictions = self.model.predict(features)
        mean, std = predictions.mean(axis=0), predictions.std(axis=0)
        sampled = mean + std * self.rng.standard_normal(len(candidates))
        return self._remember(copy_config(candidates[int(np.argmax(sampled))]))

    def candidates(self) -> tuple[list[Config], np.ndarray]:
        """Unproposed neighbours and double mutations of the current climb's best configs, and the unproposed
        configs of the random pool, with their features. A parent's neighbours and their features are kept
        while it stays among the best."""
        members = np.array(self.climb_members, dtype=int)
        top = [self.configs[i] for i in members[np.argsort(-self.scores[members], kind="stable")[:self.num_parents]]]
        keys: set[Any] = set()
        configs: list[Config] = []
        blocks: list[np.ndarray] = []

        def add(new_keys: list[Any], new_configs: list[Config], rows: np.ndarray) -> None:
            fresh = [i for i, key in enumerate(new_keys) if key not in self.seen and key not in keys]
            keys.update(new_keys[i] for i in fresh)
            configs.extend(new_configs[i] for i in fresh)
            blocks.append(rows[fresh])

        around: dict[Any, tuple[list[Any], list[Config], np.ndarray]] = {}
        for parent in top:
            parent_key = config_key(parent)
            if parent_key not in self.around:
                neighbours = self.space.neighbours(parent, self.rng)
                self.around[parent_key] = ([config_key(c) for c in neighbours], neighbours,
                                           self.encoder.encode_many(neighbours))
            around[parent_key] = self.around[parent_key]
            add(*around[parent_key])
        self.around = around  # forget the neighbourhoods of configs no longer among the best
        if top:
            mutated = [self.space.mutate(self.space.mutate(top[random_index(self.rng, len(top))], self.rng), self.rng)
                       for _ in range(self.mutations)]
            add([config_key(c) for c in mutated], mutated, self.encoder.encode_many(mutated))
        add(*self._top_up_pool())
        rows = np.concatenate(blocks) if blocks else np.zeros((0, self.encoder.size), dtype=np.float32)
        return configs, rows

    def _top_up_pool(self) -> Pool:
        """The random pool without the configs proposed since, refilled to `pool_size` with fresh samples."""
        self.pool = refill_pool(self.pool, self.seen, self.pool_size, self.encoder, self.rng)
        return self.pool

    def _fit(self) -> None:
        if self.unfitted == 0:
            return
        steps = min(self.fit_steps * self.unfitted, self.max_fit_steps)
        self.model.fit(self.features, _normal_scores(self.scores), steps=steps, batch_size=self.batch_size,
                       rng=self.rng)
        self.unfitted = 0

    def _remember(self, config: Config) -> TrialSpec:
        self.seen.add(config_key(config))
        spec = self._propose(config)
        self.pending[spec.trial_id] = (self.climb, copy_config(config))
        return spec

    def tell(self, trial_id: int, result: Result) -> None:
        score = self._score_of(trial_id, result)
        origin = self.pending.pop(trial_id, None)
        if origin is None or score is None:
            return
        climb, config = origin
        self.configs.append(config)
        self.features = np.vstack([self.features, self.encoder.encode(config)[None]])
        self.scores = np.append(self.scores, score)
        self.unfitted += 1
        if climb != self.climb:  # proposed by an earlier climb: it trains the model only
            return
        best = max((self.scores[i] for i in self.climb_members), default=-np.inf)
        self.climb_members.append(len(self.scores) - 1)
        self.stale = 0 if score > best else self.stale + 1
        if self.patience is not None and self.stale >= self.patience:
            self.climb += 1
            self.climb_members, self.stale = [], 0


def _normal_scores(scores: np.ndarray) -> np.ndarray:
    """The normal quantiles of the scores' ranks (ties share their mean rank)."""
    ranks = np.empty(len(scores))
    ranks[np.argsort(scores, kind="stable")] = np.arange(1, len(scores) + 1)
    _, tie_group = np.unique(scores, return_inverse=True)
    ranks = (np.bincount(tie_group, ranks) / np.bincount(tie_group))[tie_group]
    quantile = NormalDist().inv_cdf
    return np.array([quantile(q) for q in (ranks - 0.5) / len(scores)])
