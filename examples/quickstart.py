"""The quickstart through the Python API: regularized evolution over a CNN space on digits, on Ray.

    python examples/quickstart.py                      # embedded local Ray
    ray submit cluster.yaml examples/quickstart.py     # on a Ray cluster (the script attaches to it)
"""

from __future__ import annotations

import nasplat
from search_spaces.cnn import space
from trainers.classification import ClassificationTrainer

if __name__ == "__main__":
    result = nasplat.run(
        trainer=ClassificationTrainer, space=space, metric="valid_acc",
        controller="evolution", controller_options={"population_size": 8, "sample_size": 3},
        executor="ray", max_trials=24, max_steps=6, max_failures=1, storage="results", progress=True,
    )
    best = result.best
    print(f"best validation accuracy {best['valid_acc']:.4f}, its test accuracy {best['test_acc']:.4f} "
          f"(trial {best['trial_id']}): {best['config']}")
    print(f"results in {result.path}; `nasplat report {result.path}` draws them")
