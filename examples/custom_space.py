"""A user-defined search space with a conditional part, a user-written Trainer, and regularized evolution."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits

import nasplat
from nasplat import Choice, Float, Trainer

# The optimizer is a conditional decision: `momentum` exists only with SGD, `beta1` only with Adam.
space = {
    "hidden": Choice([16, 32, 64]),
    "lr": Float(1e-3, 3e-1, log=True),
    "optimizer": Choice([{"name": "sgd", "momentum": Float(0.0, 0.95)}, {"name": "adam", "beta1": Float(0.8, 0.95)}]),
}
x, y = load_digits(return_X_y=True)
order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))  # fixed: 1,200 train, 300 valid, 297 test
x, y = torch.tensor(x / 16.0, dtype=torch.float32)[order], torch.tensor(y)[order]
TRAIN, VALID, TEST = slice(0, 1200), slice(1200, 1500), slice(1500, None)


class MLPTrainer(Trainer):
    def setup(self, config, ctx):
        torch.manual_seed(ctx.seed)
        self.model = torch.nn.Sequential(torch.nn.Linear(64, config["hidden"]), torch.nn.ReLU(),
                                         torch.nn.Linear(config["hidden"], 10))
        opt = config["optimizer"]
        self.opt = torch.optim.SGD(self.model.parameters(), config["lr"], momentum=opt["momentum"]) \
            if opt["name"] == "sgd" else torch.optim.Adam(self.model.parameters(), config["lr"], (opt["beta1"], 0.999))

    def step(self):  # 20 full-batch updates, then accuracy on the validation (to search on) and test sets
        for _ in range(20):
            self.opt.zero_grad()
            F.cross_entropy(self.model(x[TRAIN]), y[TRAIN]).backward()
            self.opt.step()
        with torch.no_grad():
            return {f"{name}_acc": (self.model(x[part]).argmax(1) == y[part]).float().mean().item()
                    for name, part in (("valid", VALID), ("test", TEST))}


if __name__ == "__main__":
    torch.set_num_threads(1)
    result = nasplat.run(trainer=MLPTrainer, space=space, controller="evolution", metric="valid_acc",
                         controller_options={"population_size": 8, "sample_size": 3}, max_trials=24, max_steps=5,
                         executor="local", seed=0)
    best = result.best
    print(f"best valid_acc={best['valid_acc']:.4f}, its test_acc={best['test_acc']:.4f} "
          f"(trial {best['trial_id']}, step {best['step']}): {best['config']}")
