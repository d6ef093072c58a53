"""FT-Transformer's recipe: early stopping on validation loss keeps the lowest-loss epoch's weights,
patience or the cap ends training (and the record says which), the library's parameter groups,
and categorical columns as categorical embeddings."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from workers.inputs import DatasetSpec, open_dataset
from workers.models.extraction import load_extractor, prepare_model
from workers.models.registry import resolve_model
from workers.models.trained.ft import adapter as ft_transformer
from workers.models.trained.ft import training as ft_training
from workers.models.trained.ft.data import STATS_PREFIX, encode, init_model
from workers.models.trained.loop import Recipe, copy_weights, run_epochs
from workers.models.trained.split import table_split


class Scripted(Recipe):
    """Validation losses read from a script; the weights are the epoch's number."""

    def __init__(self, losses: list[float], patience: int) -> None:
        self.losses, self.epochs, self.patience = losses, len(losses), patience
        self.model = torch.nn.Linear(1, 1, bias=False)
        self.modules, self.optimizers, self.schedules = {"model": self.model}, [], []
        self.generators, self.buffers = {}, {}

    def epoch(self, epoch: int) -> dict[str, float]:
        with torch.no_grad():
            self.model.weight.fill_(epoch)
        return {"val_loss": self.losses[epoch - 1]}

    def weights(self):
        return copy_weights(self.model)


def test_early_stopping_keeps_the_lowest_loss_weights_and_counts_patience():
    # Epoch 4 ties epoch 2's loss: not lower, so the patience count runs on and stops there.
    outcome = run_epochs(Scripted([3.0, 1.0, 2.0, 1.0, 0.5], patience=2), "m", 0, {3})
    assert (outcome.epochs_run, outcome.stopped_by) == (4, "patience")
    assert (outcome.best_epoch, outcome.best_value) == (2, 1.0)
    assert float(outcome.best["weight"]) == 2.0  # a copy of epoch 2's weights
    assert float(outcome.kept[3]["weight"]) == 3.0
    outcome = run_epochs(Scripted([3.0, 1.0, 2.0], patience=2), "m", 0, set())
    assert (outcome.epochs_run, outcome.stopped_by, outcome.best_epoch) == (3, "max_epochs", 2)


@pytest.fixture(scope="module")
def noisy(tmp_path_factory):
    """A small table of noise with a text (categorical) column."""
    rng = np.random.default_rng(5)
    path = tmp_path_factory.mktemp("noisy") / "noisy.csv"
    rows = [f"{a:.4f},{b:.4f},{c},{y}" for a, b, c, y in zip(
        rng.normal(size=40), rng.normal(size=40), rng.choice(["red", "green", "blue"], 40),
        rng.integers(0, 2, 40), strict=True)]
    path.write_text("a,b,colour,target\n" + "\n".join(rows) + "\n")
    return open_dataset(DatasetSpec(kind="tabular", path=str(path)))


SPEC = resolve_model("ft-transformer", n_blocks=2, d_block=8, max_epochs=2, patience=16,
                     batch_size=8)


@pytest.fixture(scope="module")
def trained(noisy, tmp_path_factory):
    cache = tmp_path_factory.mktemp("ft-cache")
    return cache, prepare_model(SPEC, noisy, cache)


def test_patience_ends_training_and_the_kept_weights_are_the_best_epochs(noisy, tmp_path,
                                                                         monkeypatch):
    scripted = iter([3.0, 2.0, 1.0, 1.5, 1.0, 1.2, 0.1])  # best: epoch 3; patience 3 -> stop at 6
    seen = []  # the weights each epoch's validation loss was computed on

    def scripted_loss(model, part, loss_fn):
        seen.append({k: v.detach().clone() for k, v in model.state_dict().items()})
        return next(scripted)

    monkeypatch.setattr(ft_training, "_loss", scripted_loss)
    spec = resolve_model("ft-transformer", n_blocks=2, d_block=8, max_epochs=50, patience=3,
                         batch_size=8)
    record = prepare_model(spec, noisy, tmp_path)
    assert (record["stopped_by"], record["best_epoch"], record["epochs_run"]) == ("patience", 3, 6)
    assert record["history"]["val_loss"] == [3.0, 2.0, 1.0, 1.5, 1.0, 1.2]
    assert record["val_loss"] == 1.0
    saved = load_file(str(ft_transformer.checkpoint_path(spec, noisy.table, tmp_path)))
    assert all(torch.equal(saved[k], v) for k, v in seen[2].items())  # epoch 3's weights
    assert not all(torch.equal(saved[k], v) for k, v in seen[5].items())  # not the last epoch's


def test_the_cap_ends_training_and_the_record_scores_the_saved_weights(trained, noisy):
    cache, record = trained
    val_loss = record["history"]["val_loss"]
    assert (record["stopped_by"], record["epochs_run"], len(val_loss)) == ("max_epochs", 2, 2)
    assert record["best_epoch"] == int(np.argmin(val_loss)) + 1
    state = load_file(str(ft_transformer.checkpoint_path(SPEC, noisy.table, cache)))
    stats = {k: state.pop(k) for k in list(state) if k.startswith(STATS_PREFIX)}
    assert {"stats.quantiles", "stats.references"} <= set(stats)  # the default: quantile
    model = init_model(SPEC.options, SPEC.seed, noisy.table)
    model.load_state_dict(state)
    model.eval()
    rows = table_split(SPEC.options, SPEC.seed, noisy.table)["val"]
    with torch.no_grad():
        out = model(*encode(noisy.table.features[rows], noisy.table, stats))
    target = torch.as_tensor(noisy.table.target[rows])
    loss = float(torch.nn.functional.cross_entropy(out, target))
    assert loss == pytest.approx(record["val_loss"], rel=1e-5)
    assert record["val_score"] == pytest.approx(float((out.argmax(-1) == target).double().mean()))


def test_the_optimiser_is_adamw_with_the_librarys_parameter_groups(noisy, monkeypatch):
    made = []
    real = torch.optim.AdamW

    def spy(groups, **kwargs):
        made.append((groups, kwargs))
        return real(groups, **kwargs)

    monkeypatch.setattr(torch.optim, "AdamW", spy)
    spec = resolve_model("ft-transformer", n_blocks=1, d_block=8, max_epochs=1, last_block="full")
    ft_training.train(spec, noisy.table)
    (groups, kwargs), = made
    assert kwargs == {"lr": 1e-4, "weight_decay": 1e-5}
    no_decay = next(g for g in groups if g.get("weight_decay") == 0.0)["params"]
    model = init_model(spec.options, spec.seed, noisy.table)
    shapes = sorted(tuple(p.shape) for p in no_decay)
    expected = model.make_parameter_groups()[1]["params"]
    assert shapes == sorted(tuple(p.shape) for p in expected)
    assert len(no_decay) > 0 and sum(len(g["params"]) for g in groups) == len(
        list(model.parameters()))


def test_categorical_columns_are_categorical_embeddings(trained, noisy):
    cache, record = trained
    table = noisy.table
    assert table.categorical == (2,) and table.cardinalities == (3,)
    assert table.continuous == (0, 1)
    assert record["inputs"] == {"n_cont": 2, "cat_cardinalities": [3], "d_out": 2}
    ex = load_extractor(SPEC, dataset=noisy, cache_dir=cache, device="cpu")
    embeddings = ex.model.cat_embeddings.embeddings
    assert [e.num_embeddings for e in embeddings] == [3]
    assert ex.model.cont_embeddings.weight.shape[0] == 2
    row = noisy.load([0])[0]
    inputs = ex.prepare([row]).inputs
    assert inputs["x_cat"].dtype == torch.int64 and inputs["x_cat"].tolist() == [[int(row[2])]]
    out = ex.extract([row], noisy.ids[:1])[0]
    assert out.attention.shape == (1, 4, 4)  # CLS, 2 continuous, 1 categorical token


def test_a_binary_table_trains_two_logits_with_cross_entropy_as_the_recipe_table_says(
        noisy, monkeypatch):
    """The project's binary head is 2 logits under softmax cross-entropy, where the paper's
    code uses 1 logit and binary cross-entropy with logits; docs/ft-transformer.md's recipe
    table documents the difference (changing it would retrain every binary FT model)."""
    from pathlib import Path

    from workers.models.trained.ft.data import output_size

    losses = []
    real = torch.nn.CrossEntropyLoss

    def spy(*args, **kwargs):
        losses.append(real)
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.nn, "CrossEntropyLoss", spy)
    assert sorted(set(noisy.table.target.tolist())) == [0, 1] and output_size(noisy.table) == 2
    spec = resolve_model("ft-transformer", n_blocks=1, d_block=8, max_epochs=1,
                         last_block="full")
    model = init_model(spec.options, spec.seed, noisy.table)
    head = [m for m in model.modules() if isinstance(m, torch.nn.Linear)][-1]
    assert head.out_features == 2  # the output layer: one logit per class
    record = ft_training.train(spec, noisy.table)[2]
    assert losses and record["hyperparameters"]["loss"] == "cross_entropy"
    recipe = (Path(__file__).parent.parent / "docs" / "ft-transformer.md").read_text()
    row = next(line for line in recipe.splitlines() if line.startswith("| loss and output head"))
    assert "**2 logits**" in row and "1 logit and binary cross-entropy with logits" in row
