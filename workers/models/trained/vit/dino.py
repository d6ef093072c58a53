"""The digits ViT trained without labels: self-distillation in the manner of DINO (Caron et al.
2021), scaled down to 8 x 8 digits.

- **Views.** Each training digit gives `GLOBAL_VIEWS` global views (a random crop of a share
  `GLOBAL_SCALE` of its area) and `LOCAL_VIEWS` local ones (`LOCAL_SCALE`), each resized back
  to 8 x 8 (bilinear, the background beyond the digit filled), with random contrast
  (`CONTRAST`) and brightness (`BRIGHTNESS`); no flip (a mirrored digit is another symbol).
  Drawn from a generator of their own, seeded from the spec's seed.
- **Student and teacher.** The student is the ViT and a projection head on its CLS feature
  (MLP 64 -> 128 -> 128 -> 32 with batch norms and GELU, DINO's `use_bn_in_head`; then cosine
  scores against `PROTOTYPES` normalised prototypes); the teacher is their exponential moving
  average, its momentum rising from `MOMENTUM` to 1 along a cosine over every step.
- **Loss.** Cross-entropy from the teacher's centred, sharpened distribution on each global
  view (temperature `TEACHER_T`; centre: an EMA, rate `CENTER_MOMENTUM`, of the teacher's batch
  means) to the student's (temperature `STUDENT_T`) on every other view; gradients clipped to
  norm `CLIP`. AdamW and the one-cycle learning rate of the supervised recipe, on the student.
- **Scaled down, measured here.** At DINO's own settings (teacher temperature 0.04, no batch
  norm in the head, crops of 50-100% and 20-50% of the area) this ViT collapsed on the digits
  (the loss went to ln K, the features learned nothing); the batch norms (DINO's option for
  small heads), a sharper teacher (0.02, as DINO's authors advise against collapse) and milder
  crops gave a loss that falls and features that beat the initialisation's (docs/training.md).
- **What is kept.** The teacher's ViT (DINO evaluates and releases its teacher): after each kept
  epoch, and at the last epoch as the model ("best": no label picks an epoch). Its classifier
  head is never trained (attention does not read it).
- **Scores.** Per epoch, the teacher's k-NN accuracy on the validation and test digits
  (`vit.probe`); the record's test score is a linear probe's (`vit.probe.linear_probe`).
"""

from __future__ import annotations

import copy
import math
from typing import Any

import torch

from workers.inputs import Table
from workers.models.registry import ModelSpec
from workers.models.trained.loop import Outcome, State, copy_weights
from workers.models.trained.vit.probe import features, knn_accuracy
from workers.models.trained.vit.training import DigitsRecipe

GLOBAL_VIEWS, LOCAL_VIEWS = 2, 2
GLOBAL_SCALE, LOCAL_SCALE = (0.7, 1.0), (0.35, 0.7)  # shares of the digit's area
CONTRAST, BRIGHTNESS = (0.7, 1.3), (-0.2, 0.2)  # on pixels scaled to [-1, 1]
HIDDEN, BOTTLENECK, PROTOTYPES = 128, 32, 256
TEACHER_T, STUDENT_T, CENTER_MOMENTUM = 0.02, 0.1, 0.9
MOMENTUM, CLIP = 0.996, 3.0
VIEW_SEED = 1_000_003  # added to the spec's seed: the views' generator


class Head(torch.nn.Module):
    """DINO's projection head: an MLP to a bottleneck, then cosine scores to prototypes."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(width, HIDDEN), torch.nn.BatchNorm1d(HIDDEN), torch.nn.GELU(),
            torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.BatchNorm1d(HIDDEN), torch.nn.GELU(),
            torch.nn.Linear(HIDDEN, BOTTLENECK))
        self.prototypes = torch.nn.Parameter(torch.randn(PROTOTYPES, BOTTLENECK) * 0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (images, width) -> (images, K)
        z = torch.nn.functional.normalize(self.mlp(x), dim=-1)
        return z @ torch.nn.functional.normalize(self.prototypes, dim=-1).T


def views(x: torch.Tensor, generator: torch.Generator, scale: tuple[float, float]
          ) -> torch.Tensor:
    """One random view of each image of `x` ((images, 1, 8, 8) in [-1, 1]): a crop of a
    random share `scale` of its area at a random place, resized back, then contrast and
    brightness."""
    n = len(x)
    draw = torch.rand(n, 5, generator=generator)  # (images, area share, x, y, contrast, bright)
    side = (scale[0] + (scale[1] - scale[0]) * draw[:, 0]).sqrt()
    theta = torch.zeros(n, 2, 3)
    theta[:, 0, 0] = theta[:, 1, 1] = side
    theta[:, 0, 2] = (1 - side) * (2 * draw[:, 1] - 1)
    theta[:, 1, 2] = (1 - side) * (2 * draw[:, 2] - 1)
    grid = torch.nn.functional.affine_grid(theta, list(x.shape), align_corners=False)
    crop = torch.nn.functional.grid_sample(x + 1, grid, align_corners=False) - 1  # fill: -1
    contrast = CONTRAST[0] + (CONTRAST[1] - CONTRAST[0]) * draw[:, 3]
    bright = BRIGHTNESS[0] + (BRIGHTNESS[1] - BRIGHTNESS[0]) * draw[:, 4]
    return (crop * contrast[:, None, None, None] + bright[:, None, None, None]).clamp(-1, 1)


class DinoRecipe(DigitsRecipe):
    """Self-distillation without labels (see the module) for `workers.models.trained.loop`."""

    selection, score = None, "val_knn_accuracy"

    def __init__(self, spec: ModelSpec, table: Table) -> None:
        super().__init__(spec, table)
        width = int(spec.options["embed_dim"])
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(spec.seed)
            self.head = Head(width)
        self.teacher = copy.deepcopy(self.model).requires_grad_(False)
        self.teacher_head = copy.deepcopy(self.head).requires_grad_(False)
        self.optimizer = torch.optim.AdamW([*self.model.parameters(), *self.head.parameters()],
                                           lr=float(self.options["lr"]),
                                           weight_decay=float(self.options["weight_decay"]))
        self.schedule = torch.optim.lr_scheduler.OneCycleLR(
            self.optimizer, max_lr=float(self.options["lr"]), total_steps=self.total_steps)
        self.view_generator = torch.Generator().manual_seed(spec.seed + VIEW_SEED)
        self.modules = {"student": self.model, "head": self.head, "teacher": self.teacher,
                        "teacher_head": self.teacher_head}
        self.optimizers, self.schedules = [self.optimizer], [self.schedule]
        self.generators = {"batches": self.generator, "views": self.view_generator}
        self.buffers = {"center": torch.zeros(1, PROTOTYPES), "step": torch.zeros(())}

    def weights(self) -> State:
        return copy_weights(self.teacher)

    def momentum(self) -> float:
        """The teacher's EMA momentum at this step: MOMENTUM rising to 1 along a cosine."""
        done = float(self.buffers["step"]) / max(1, self.total_steps - 1)
        return 1 - (1 - MOMENTUM) * (math.cos(math.pi * min(done, 1.0)) + 1) / 2

    def epoch(self, epoch: int) -> dict[str, float]:
        self.model.train()
        self.head.train()
        x = self.data["train"][0]
        total = 0.0
        for rows in self.batches():
            images = x[rows]
            crops = [views(images, self.view_generator, GLOBAL_SCALE)
                     for _ in range(GLOBAL_VIEWS)]
            crops += [views(images, self.view_generator, LOCAL_SCALE)
                      for _ in range(LOCAL_VIEWS)]
            loss = self.loss(crops)
            self.optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_([*self.model.parameters(), *self.head.parameters()],
                                           CLIP)
            self.optimizer.step()
            self.schedule.step()
            self.follow()
            total += loss.item() * len(rows)
        train_x, train_y = self.data["train"]
        reference = features(self.teacher, train_x)
        return {"train_loss": total / len(train_y),
                **{f"{part}_knn_accuracy": knn_accuracy(
                    reference, train_y, features(self.teacher, self.data[part][0]),
                    self.data[part][1], self.classes) for part in ("val", "test")}}

    def loss(self, crops: list[torch.Tensor]) -> torch.Tensor:
        """DINO's loss of one batch's views, and the centre's update."""
        with torch.no_grad():
            self.teacher.eval()
            self.teacher_head.train()  # its batch norms on the batch, as the student's
            targets = [self.teacher_head(self.teacher.forward_head(
                self.teacher.forward_features(c), pre_logits=True)) for c in crops[:GLOBAL_VIEWS]]
        outputs = [self.head(self.model.forward_head(self.model.forward_features(c),
                                                     pre_logits=True)) for c in crops]
        center = self.buffers["center"]
        shares = [torch.softmax((t - center) / TEACHER_T, dim=-1) for t in targets]
        terms = []
        for i, p in enumerate(shares):
            for j, output in enumerate(outputs):
                if i != j:
                    terms.append(-(p * torch.log_softmax(output / STUDENT_T, dim=-1)).sum(-1)
                                 .mean())
        batch_mean = torch.cat(targets).mean(0, keepdim=True)
        self.buffers["center"] = center * CENTER_MOMENTUM + batch_mean * (1 - CENTER_MOMENTUM)
        return torch.stack(terms).mean()

    def follow(self) -> None:
        """The teacher one EMA step towards the student."""
        m = self.momentum()
        with torch.no_grad():
            for pair in ((self.model, self.teacher), (self.head, self.teacher_head)):
                for s, t in zip(pair[0].parameters(), pair[1].parameters(), strict=True):
                    t.mul_(m).add_(s.detach(), alpha=1 - m)
        self.buffers["step"] = self.buffers["step"] + 1

    def hyperparameters(self) -> dict[str, Any]:
        return {**super().hyperparameters(), "loss": "DINO self-distillation (no labels)",
                "augmentation": {"global_views": GLOBAL_VIEWS, "local_views": LOCAL_VIEWS,
                                 "global_scale": list(GLOBAL_SCALE),
                                 "local_scale": list(LOCAL_SCALE),
                                 "contrast": list(CONTRAST), "brightness": list(BRIGHTNESS)},
                "head": {"hidden": HIDDEN, "bottleneck": BOTTLENECK, "prototypes": PROTOTYPES},
                "teacher_temperature": TEACHER_T, "student_temperature": STUDENT_T,
                "center_momentum": CENTER_MOMENTUM, "teacher_momentum": [MOMENTUM, 1.0],
                "gradient_clip": CLIP, "selection": "the last epoch (the teacher)",
                "kept": "the teacher's ViT"}

    def scores(self, outcome: Outcome) -> dict[str, Any]:
        probe = self.probes["kept"]
        return {"test_score": probe["test"], "val_score": probe["val"],
                "score_by": "linear probe on the teacher's CLS features (vit.probe)"}
