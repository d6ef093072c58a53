"""The digits ViT with a distillation token taught by a supervised teacher, in the manner of DeiT
(Touvron et al. 2021), scaled down to 8 x 8 digits.

- **Model.** timm's `VisionTransformerDistilled` of the same size: a DIST token after CLS, and
  a head of its own on it; in eval mode its prediction is the mean of the two heads'.
- **Teacher.** A small convolutional network (DeiT's best teachers were convnets): two 3 x 3
  convolutions of `TEACHER_WIDTH` and twice that, ReLU, 2 x 2 max pooling, a linear classifier;
  trained first on the same training digits (Adam, lr `TEACHER_LR`, `TEACHER_EPOCHS` epochs,
  batches of `TEACHER_BATCH` in a seeded order), then frozen. Its test accuracy is in the record.
- **Loss.** DeiT's hard distillation: ½ cross-entropy of the CLS head to the label plus ½
  cross-entropy of the DIST head to the teacher's predicted label. AdamW, the one-cycle learning
  rate and the batches of the supervised recipe; no augmentation; the kept weights are the epoch
  of lowest validation loss (of the averaged heads), as the supervised recipe's.
"""

from __future__ import annotations

from typing import Any

import torch

from workers.inputs import Table
from workers.models.registry import ModelSpec
from workers.models.trained.vit.training import DigitsRecipe, evaluate

TEACHER_WIDTH, TEACHER_LR, TEACHER_EPOCHS, TEACHER_BATCH = 16, 1e-3, 15, 32
TEACHER_SEED = 2_000_003  # added to the spec's seed: the teacher's weights and batch order


def convnet(classes: int) -> torch.nn.Module:
    """The teacher's architecture (see the module), for (images, 1, 8, 8) inputs."""
    w = TEACHER_WIDTH
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, w, 3, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(w, 2 * w, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(2 * w * 4 * 4, classes))


def train_teacher(x: torch.Tensor, y: torch.Tensor, classes: int, seed: int) -> torch.nn.Module:
    """The teacher trained on (x, y) (see the module), frozen, in eval mode; torch's global RNG
    is left as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed + TEACHER_SEED)
        teacher = convnet(classes)
    generator = torch.Generator().manual_seed(seed + TEACHER_SEED)
    optimizer = torch.optim.Adam(teacher.parameters(), lr=TEACHER_LR)
    teacher.train()
    for _ in range(TEACHER_EPOCHS):
        order = torch.randperm(len(y), generator=generator)
        for start in range(0, len(y), TEACHER_BATCH):
            rows = order[start:start + TEACHER_BATCH]
            loss = torch.nn.functional.cross_entropy(teacher(x[rows]), y[rows])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return teacher.eval().requires_grad_(False)


class DistilledRecipe(DigitsRecipe):
    """DeiT-style hard distillation (see the module) for `workers.models.trained.loop`."""

    def __init__(self, spec: ModelSpec, table: Table) -> None:
        super().__init__(spec, table)
        x, y = self.data["train"]
        self.teacher = train_teacher(x, y, self.classes, spec.seed)
        with torch.no_grad():
            self.taught = self.teacher(x).argmax(-1)  # the teacher's label of each digit
        self.model.set_distilled_training(True)

    def epoch(self, epoch: int) -> dict[str, float]:
        self.model.train()
        x, y = self.data["train"]
        total = 0.0
        for rows in self.batches():
            cls, dist = self.model(x[rows])
            loss = (torch.nn.functional.cross_entropy(cls, y[rows])
                    + torch.nn.functional.cross_entropy(dist, self.taught[rows])) / 2
            self.step(loss)
            total += loss.item() * len(rows)
        val_loss, val_accuracy = evaluate(self.model, self.data["val"])
        return {"train_loss": total / len(y), "val_loss": val_loss, "val_accuracy": val_accuracy,
                "test_accuracy": evaluate(self.model, self.data["test"])[1]}

    def hyperparameters(self) -> dict[str, Any]:
        _, teacher_test = evaluate(self.teacher, self.data["test"])
        return {**super().hyperparameters(),
                "loss": "1/2 cross-entropy (CLS head, labels) + 1/2 cross-entropy (DIST head, "
                        "the teacher's hard labels)",
                "teacher": {"architecture": "conv3x3(16)-relu-conv3x3(32)-relu-maxpool2-linear",
                            "optimizer": "Adam", "lr": TEACHER_LR, "epochs": TEACHER_EPOCHS,
                            "batch_size": TEACHER_BATCH, "test_accuracy": teacher_test,
                            "agreement_on_train": float(
                                (self.taught == self.data["train"][1]).double().mean())}}
