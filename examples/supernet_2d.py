"""Your own supernet for 2-D images (sklearn digits, 8x8): your operations, your cell, trained with SPOS.

    python examples/supernet_2d.py        # about 10 s on one CPU core

Each `ChoiceLayer` is a decision of a nasplat space (its options are the dict's keys), a `ChoiceInput` an edge whose
input is one; `supernet.space()` is the space every nasplat controller searches. The trial trains one uniformly
sampled path per batch; then a path is judged by the weights it inherits (batch norm recalibrated) and extracted
as a standalone module.
"""

from __future__ import annotations

import torch
from torch import nn

from nasplat.oneshot import ChoiceInput, ChoiceLayer, Supernet, SupernetTrainer, evaluate_path
from nasplat.trainer import WorkerContext, start
from trainers.classification import load_dataset


def conv(c: int, k: int, dilation: int = 1) -> nn.Module:
    return nn.Sequential(nn.Conv2d(c, c, k, padding=dilation * (k // 2), dilation=dilation, bias=False),
                         nn.BatchNorm2d(c), nn.ReLU())


def candidates(c: int) -> dict[str, nn.Module]:
    """Your own operations, by name: the options of each searched layer."""
    return {"conv3": conv(c, 3), "conv5": conv(c, 5), "dil3": conv(c, 3, dilation=2),
            "maxpool": nn.MaxPool2d(3, 1, 1), "identity": nn.Identity()}


class Block(nn.Module):
    """Two searched operations; the second reads the block input or the first's output (a searched edge)."""

    def __init__(self, c: int, name: str) -> None:
        super().__init__()
        self.a = ChoiceLayer(f"{name}.op_a", candidates(c))
        self.b = ChoiceLayer(f"{name}.op_b", candidates(c))
        self.source = ChoiceInput(f"{name}.b_input", ["block_input", "op_a"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.a(x)
        return a + self.b(self.source([x, a]))


class DigitsSupernet(Supernet):
    def __init__(self, c: int = 16) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, c, 3, padding=1, bias=False), nn.BatchNorm2d(c), nn.ReLU())
        self.blocks = nn.Sequential(Block(c, "block1"), nn.MaxPool2d(2), Block(c, "block2"))
        self.head = nn.Sequential(nn.BatchNorm2d(c), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(x)))


class DigitsSupernetTrainer(SupernetTrainer):
    """A nasplat trial (checkpointable, resumable, data-parallel) that trains `DigitsSupernet`."""

    def load_data(self, config):
        return load_dataset("digits")

    def build_supernet(self, config, data):
        return DigitsSupernet()


if __name__ == "__main__":
    config = {"sampler": "spos", "lr": 0.1, "batch_size": 32, "epochs": 5}
    trainer = start(DigitsSupernetTrainer(), config, WorkerContext(seed=0))
    print("space:", {key: domain.options for key, domain in trainer.space.domains.items()})
    for _ in range(5):
        row = trainer.step()
        print(f"epoch {row['epoch']:.0f}: train loss {row['train_loss']:.3f}, mean valid acc of "
              f"{len(trainer.eval_configs)} paths {row['valid_acc']:.3f} ({row['eval_ms']:.0f} ms a path)")
    path = {"block1.op_a": "conv3", "block1.op_b": "conv5", "block1.b_input": "op_a",
            "block2.op_a": "dil3", "block2.op_b": "identity", "block2.b_input": "block_input"}
    print("path", path, "->", evaluate_path(trainer.net, path, trainer.data, splits=("valid", "test")))
    subnet = trainer.net.extract(path)  # a standalone nn.Module with copies of the path's weights
    print(f"extracted: {sum(p.numel() for p in subnet.parameters())} parameters "
          f"(the supernet holds {sum(p.numel() for p in trainer.net.parameters())})")
