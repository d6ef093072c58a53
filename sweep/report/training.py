"""The report's training section: each trained model's record, as the store keeps it.

A model trained by the project (FT-Transformer) has its training record (`prepare_model`'s) in
its group's `training` attribute. `training_records` collects them (JSON: `training`, model name
-> record); `render_markdown` prints one row per model: the test and validation scores, where
early stopping kept the weights and what ended training, the split and the wall time.
"""

from __future__ import annotations

from typing import Any

import xarray as xr

from storage.query.results import model_names

COLUMNS = ("model", "metric", "test", "val", "best epoch", "epochs run", "stopped by",
           "train/val/test rows", "params", "wall s")


def training_records(tree: xr.DataTree) -> dict[str, dict[str, Any]]:
    """Model name -> its training record, for the models of `tree` that have one (store order)."""
    records = {}
    for name in model_names(tree):
        record = tree[name].attrs.get("training")
        if record:
            records[name] = dict(record)
    return records


def render_markdown(records: dict[str, dict[str, Any]]) -> list[str]:
    """The training section's Markdown lines: a heading, a note and one row per trained model."""
    out = ["## 7. Training: models trained by the project", ""]
    if not records:
        return [*out, "(no trained models)", ""]
    out += ["Test and validation scores of the kept weights (the epoch of lowest validation "
            "loss); `stopped by` says whether early stopping (patience) or the epoch cap ended "
            "training. Attention is measured on the rows named by each model's `split` option.",
            "", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for name, r in records.items():
        split = r.get("split", {})
        cells = [
            name, r.get("metric", "–"), _score(r.get("test_score")), _score(r.get("val_score")),
            r.get("best_epoch", "–"), r.get("epochs_run", "–"), r.get("stopped_by", "–"),
            "/".join(str(split.get(part, "–")) for part in ("train", "val", "test")),
            r.get("n_params", "–"), _score(r.get("wall_s"), "{:.1f}"),
        ]
        out.append("| " + " | ".join(str(c) for c in cells) + " |")
    return [*out, ""]


def _score(value: Any, form: str = "{:.4f}") -> str:
    return "–" if value is None else form.format(value)
