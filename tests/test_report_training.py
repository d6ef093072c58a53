"""`sweep report` prints each trained model's training record (Markdown; JSON `training`)."""

from __future__ import annotations

import json

from storage.query import open_results
from storage.store import write_training_record
from sweep.cli.entry import main
from sweep.report.tables import build_report
from tests.store_fixtures import hand_store

RECORD = {
    "metric": "accuracy", "test_score": 0.9649, "val_score": 0.9737, "val_loss": 0.081,
    "best_epoch": 41, "epochs_run": 57, "stopped_by": "patience",
    "split": {"train": 341, "val": 114, "test": 114}, "wall_s": 83.31, "n_params": 92546,
    "hyperparameters": {"lr": 1e-4, "weight_decay": 1e-5, "patience": 16},
}


def test_training_records_reach_markdown_and_json(tmp_path, capsys):
    store = hand_store(tmp_path / "sweep.zarr")
    write_training_record(store, "alpha", RECORD)
    report = build_report(open_results(store), store=str(store))
    assert report.training == {"alpha": RECORD}  # beta was not trained: no record
    assert main(["report", str(store), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["training"] == {"alpha": RECORD}
    assert main(["report", str(store)]) == 0
    text = capsys.readouterr().out
    assert "## 7. Training" in text
    assert ("| alpha | accuracy | 0.9649 | 0.9737 | 41 | 57 | patience | 341/114/114 | 92546 "
            "| 83.3 |") in text


def test_a_store_without_trained_models_says_so(tmp_path, capsys):
    store = hand_store(tmp_path / "sweep.zarr")
    assert main(["report", str(store)]) == 0
    assert "(no trained models)" in capsys.readouterr().out
