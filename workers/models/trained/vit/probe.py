"""How good a digits ViT's features are, whatever its objective: a linear probe and k-NN.

Features: the CLS token after the final norm (`forward_head(pre_logits=True)`; for the distilled
model, the mean of CLS and DIST as its own head reads them), eval mode, no gradient. The linear
probe is scikit-learn's `LogisticRegression` (lbfgs, C = 1, up to 2,000 iterations) on the
training digits' standardised features, scored on the validation and test digits; k-NN is
DINO's weighted vote (Caron et al. 2021) on features centred on the training mean: the 20
training digits of highest cosine similarity, each voting exp(similarity / 0.07) for its
label. Labels are read here only, never in training the self-supervised objective.
"""

from __future__ import annotations

import numpy as np
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import StandardScaler
from timm.models.deit import VisionTransformerDistilled

KNN_K, KNN_T = 20, 0.07
PROBE_C, PROBE_ITER = 1.0, 2000


def features(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """(images, embed_dim) float32 features of `x` (see the module)."""
    model.eval()
    with torch.no_grad():
        tokens = model.forward_features(x)  # (images, tokens, embed_dim)
    if isinstance(model, VisionTransformerDistilled):
        return (tokens[:, 0] + tokens[:, 1]) / 2
    return model.forward_head(tokens, pre_logits=True)


def knn_accuracy(train: torch.Tensor, labels: torch.Tensor, query: torch.Tensor,
                 truth: torch.Tensor, classes: int) -> float:
    """DINO's weighted k-NN accuracy of `query` features against the `train` features, both
    centred on the training features' mean first (a small ViT's CLS features share a large
    common part that would make every cosine near 1)."""
    mean = train.mean(0, keepdim=True)
    a = torch.nn.functional.normalize(train - mean, dim=1)
    b = torch.nn.functional.normalize(query - mean, dim=1)
    similarity, index = (b @ a.T).topk(min(KNN_K, len(a)), dim=1)  # (queries, k)
    votes = torch.zeros(len(b), classes).scatter_add_(1, labels[index],
                                                       (similarity / KNN_T).exp())
    return float((votes.argmax(1) == truth).double().mean())


def linear_probe(train: torch.Tensor, labels: torch.Tensor,
                 parts: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> dict[str, float]:
    """The probe's accuracy on each of `parts` (name -> (features, labels)), fitted on `train`."""
    scale = StandardScaler().fit(train.double().numpy())
    probe = LogisticRegression(C=PROBE_C, max_iter=PROBE_ITER)
    probe.fit(scale.transform(train.double().numpy()), labels.numpy())
    return {name: float(np.mean(probe.predict(scale.transform(x.double().numpy())) == y.numpy()))
            for name, (x, y) in parts.items()}
