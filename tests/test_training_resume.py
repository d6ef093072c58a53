"""A training run killed part-way resumes from its last resume point, to the same bits as a run
never stopped: the recipes trained here (the FT-Transformer's, the digits ViT's supervised and
self-distilled ones), through the same epoch loop (`workers.models.trained.loop`)."""

from __future__ import annotations

import pytest

from storage.markers import TrainingProgress
from workers.inputs import DatasetSpec, open_dataset
from workers.models.extraction import prepare_model
from workers.models.registry import resolve_model
from workers.models.trained import run as training_run

CASES = {
    "ft": (("ft-transformer", {"n_blocks": 2, "d_block": 8, "max_epochs": 5, "patience": 5,
                               "keep_epochs": [0, 1, 4]}), ("tabular", "sklearn:wine")),
    "vit": (("vit-digits", {"depth": 1, "embed_dim": 8, "num_heads": 2, "epochs": 4,
                            "keep_epochs": [0, 1, 4]}), ("image", "sklearn:digits")),
    "vit-dino": (("vit-digits", {"depth": 1, "embed_dim": 8, "num_heads": 2, "epochs": 4,
                                 "batch_size": 256, "objective": "dino", "keep_epochs": [1]}),
                 ("image", "sklearn:digits")),  # a teacher, its centre, the views' generator
}


class Killed(Exception):
    """Stands for a kill -9 after an epoch (the resume point of that epoch is written)."""


def files(folder) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.suffix != ".json"}


def timeless(record: dict) -> dict:
    return {k: v for k, v in record.items() if k not in ("wall_s", "cpu_s", "resumed_from")}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_run_killed_after_epoch_2_resumes_there_to_the_same_bits(case, tmp_path, monkeypatch):
    (source, options), (kind, data) = CASES[case]
    spec = resolve_model(source, **options)
    dataset = open_dataset(DatasetSpec(kind=kind, source=data))
    whole = prepare_model(spec, dataset, tmp_path / "whole")
    monkeypatch.setattr(training_run, "RESUME_EVERY_S", 0.0)  # a point after every epoch
    monkeypatch.setattr(training_run, "REPORT_EVERY_S", 0.0)
    heard: list[TrainingProgress] = []

    def kill_after_2(progress: TrainingProgress) -> None:
        heard.append(progress)
        if progress.epoch == 2:
            raise Killed

    with pytest.raises(Killed):
        prepare_model(spec, dataset, tmp_path / "killed", report=kill_after_2)
    assert [p.epoch for p in heard] == [1, 2] and heard[-1].resume_point == 2
    assert any(name.endswith(".resume.safetensors") for name in files(tmp_path / "killed"))
    resumed = prepare_model(spec, dataset, tmp_path / "killed", report=heard.append)
    assert resumed["resumed_from"] == 2 and heard[2].resumed_from == 2 and heard[2].epoch == 3
    assert timeless(resumed) == timeless(whole)
    assert files(tmp_path / "killed") == files(tmp_path / "whole")  # no resume point left


def test_a_run_without_a_resume_point_trains_from_the_start(tmp_path, monkeypatch):
    """A kill before the first resume point (RESUME_EVERY_S of training) restarts the run, and
    the progress says the run would restart (`resume_point` None)."""
    (source, options), (kind, data) = CASES["vit"]
    spec = resolve_model(source, **options)
    dataset = open_dataset(DatasetSpec(kind=kind, source=data))
    heard: list[TrainingProgress] = []

    def kill_after_1(progress: TrainingProgress) -> None:
        heard.append(progress)
        raise Killed

    with pytest.raises(Killed):
        prepare_model(spec, dataset, tmp_path, report=kill_after_1)
    assert heard[0].resume_point is None and heard[0].line() == (
        f"vit-digits epoch 1 of 4 (val_accuracy {heard[0].value:.4f})")
    record = prepare_model(spec, dataset, tmp_path)
    assert "resumed_from" not in record and record["epochs_run"] == 4
