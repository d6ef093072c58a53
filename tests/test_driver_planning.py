"""The driver plans from specs alone: planned sizes equal what extraction produces; `sweep plan`
builds no model, loads no weights, decodes no image and trains nothing; preparation (training)
is a task that extractions wait for, and its record lands in the store."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import PIL.Image
import pytest
import safetensors
import safetensors.torch
import timm
import torch
import transformers
import zarr
from distributed import Client, LocalCluster

import workers.tasks.extract
from sweep.cli.entry import main
from sweep.config.load import load_config
from sweep.driver.graph import DaskExecutor
from sweep.driver.runner import InProcessExecutor, gather_facts, run_sweep
from workers.inputs import open_dataset
from workers.models import hf as hf_module
from workers.models.extraction import load_extractor, model_dataset
from workers.models.registry import PRESETS, resolve_model
from workers.models.trained.ft import adapter as ft_module
from workers.models.trained.ft import training as ft_training

TINY = sorted(name for name in PRESETS if name.startswith("tiny-"))
DATASET_OF = {"image": "photos", "text": "topics", "tabular": "wine"}
FT = "{source: ft-transformer, dataset: wine, options: {max_epochs: 2, n_blocks: 2}}"


def write_config(folder: Path, models: dict[str, str]) -> Path:
    lines = [
        "store: sweep.zarr", "shard_size: 4", "retries: 0", "cache_dir: cache",
        "matched_nulls: null",
        "datasets:",
        "  photos: {source: 'sklearn:sample_images', limit: 4}",
        "  topics: {source: 'pydoc:topics', limit: 6}",
        "  wine: {source: 'sklearn:wine', limit: 5}",
        "models:",
        *(f"  {name}: {entry}" for name, entry in models.items()),
    ]
    path = folder / "sweep.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def every_family(heads: str = "mean") -> dict[str, str]:
    """Every tiny preset, minilm-l6 and FT-Transformer, with option `heads`."""
    models = {name: f"{{source: {name}, dataset: {DATASET_OF[PRESETS[name].modality]}, "
                    f"options: {{heads: {heads}}}}}"
              for name in [*TINY, "minilm-l6"]}
    return {**models, "ft": FT.replace("n_blocks: 2", f"n_blocks: 2, heads: {heads}")}


def test_planned_sizes_equal_what_extraction_produces(tmp_path):
    """Layers, tokens and, with every head kept, heads: planned from the spec, as extracted."""
    config = load_config(write_config(tmp_path, every_family(heads="each")))
    for name, entry in config.models.items():
        facts = gather_facts(config, name)
        spec = resolve_model(entry.source, **entry.options)
        dataset = model_dataset(spec, open_dataset(config.datasets[entry.dataset].to_spec()))
        extractor = load_extractor(spec, dataset=dataset,
                                   cache_dir=config.checkpoint_dir, device="cpu")
        outs = extractor.extract(dataset.load(range(len(dataset))), dataset.ids)
        tokens = [out.attention.shape[-1] for out in outs]
        assert facts.input_ids == dataset.ids, name
        assert facts.n_layers == extractor.n_layers == outs[0].attention.shape[0], name
        assert facts.n_heads == outs[0].by_head.shape[1] > 1, name
        assert facts.t_max == max(tokens), name
        assert facts.cube_sum == sum(t**3 // 2 for t in tokens), name


def _refuse(what: str):
    def refuse(*args, **kwargs):
        raise AssertionError(f"the driver called {what} while planning")

    return refuse


def test_sweep_plan_builds_no_model_loads_no_weights_and_decodes_no_image(
        tmp_path, monkeypatch, capsys):
    path = write_config(tmp_path, every_family())
    for owner, name in [
        (PIL.Image, "open"), (torch, "load"), (safetensors.torch, "load_file"),
        (safetensors.torch, "load"),
        (safetensors, "safe_open"), (hf_module, "build_model"), (ft_training, "train"),
        (ft_module, "ensure_checkpoint"), (workers.tasks.extract, "load_extractor"),
        (workers.tasks.extract, "prepare_model"),
    ]:
        monkeypatch.setattr(owner, name, _refuse(f"{owner.__name__}.{name}"))
    monkeypatch.setattr(transformers.PreTrainedModel, "from_pretrained",
                        classmethod(_refuse("from_pretrained")))
    real_create = timm.create_model

    def shapes_only(*args, **kwargs):  # timm builds on the meta device, without weights
        assert torch.get_default_device().type == "meta" and not kwargs.get("pretrained")
        return real_create(*args, **kwargs)

    monkeypatch.setattr(timm, "create_model", shapes_only)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # progress shows on terminals
    assert main(["plan", str(path)]) == 0
    out, err = capsys.readouterr()
    row = next(line for line in out.splitlines() if line.startswith("ft "))
    # inputs shards L T tasks (+prepare); 2 blocks, the last one left out (last_block: skip)
    assert row.split()[2:8] == ["5", "2", "1", "1", "14", "5"]
    assert "planning ft: 5 inputs, 14 tokens, 1 layers" in err.splitlines()
    assert "planning tiny-roberta: 6 inputs, " in err
    assert not (tmp_path / "cache").exists() and not (tmp_path / "sweep.zarr").exists()


def _record_preparations(monkeypatch, order: list[str], fail: bool = False) -> None:
    real_extract = workers.tasks.extract.run_extract

    def prepare(spec, dataset, cache_dir, report=None):
        order.append(f"prepare {spec.name}")
        if fail:
            raise RuntimeError("training diverged")
        return {"metric": "accuracy", "test": 0.5, "rows": len(dataset)}

    def extract(task):
        order.append(task.key)
        return real_extract(task)

    monkeypatch.setattr(workers.tasks.extract, "prepare_model", prepare)
    monkeypatch.setattr(workers.tasks.extract, "run_extract", extract)


def test_preparation_runs_first_as_a_task_and_its_record_is_stored(tmp_path, monkeypatch):
    order: list[str] = []
    _record_preparations(monkeypatch, order)
    config = load_config(write_config(tmp_path, {"ft": FT}))
    summary = run_sweep(config, InProcessExecutor(), progress=False)
    assert summary.exit_code == 0
    assert order == ["prepare ft-transformer", "extract-ft-00000", "extract-ft-00001"]
    group = zarr.open_group(str(Path(config.store) / "ft"), mode="r")
    assert group.attrs["training"] == {"metric": "accuracy", "test": 0.5, "rows": 5}
    assert (Path(config.store) / ".sweep" / "markers" / "ft" / "prepare.done").is_file()
    order.clear()
    rerun = run_sweep(config, InProcessExecutor(), progress=False)
    assert rerun.completed == [] and "prepare-ft" in rerun.skipped and order == []


def test_no_record_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(workers.tasks.extract, "prepare_model",
                        lambda spec, dataset, cache_dir, report=None: None)
    config = load_config(write_config(tmp_path, {"ft": FT}))
    assert run_sweep(config, InProcessExecutor(), progress=False).exit_code == 0
    assert "training" not in zarr.open_group(str(Path(config.store) / "ft"), mode="r").attrs


@pytest.mark.parametrize("executor", ["in-process", "dask"])
def test_a_failed_preparation_blocks_its_extractions_and_their_tests(
        tmp_path, monkeypatch, executor, capsys):
    order: list[str] = []
    _record_preparations(monkeypatch, order, fail=True)
    config = load_config(write_config(tmp_path, {
        "ft": FT, "vit": "{source: tiny-vit, dataset: photos}"}))
    if executor == "dask":
        with LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                          resources={"GPU": 1, "CPU": 2}, dashboard_address=":0") as cluster, \
                Client(cluster) as client:
            summary = run_sweep(config, DaskExecutor(client), progress=False)
    else:
        summary = run_sweep(config, InProcessExecutor(), progress=False)
    assert list(summary.failed) == ["prepare-ft"]
    assert summary.failed["prepare-ft"].splitlines()[0] == "RuntimeError: training diverged"
    assert sorted(summary.blocked) == ["extract-ft-00000", "extract-ft-00001",
                                       "test-ft-00000", "test-ft-00001"]
    assert sorted(summary.completed) == ["extract-vit-00000", "test-vit-00000"]
    assert summary.exit_code == 1 and not any(k.startswith("extract-ft") for k in order)
    assert main(["status", str(config.store)]) == 1
    out = capsys.readouterr().out
    assert "failed ft prepare: RuntimeError: training diverged" in out
    np.testing.assert_array_equal(
        zarr.open_group(str(Path(config.store) / "ft"), mode="r")["n_tokens"][:], 0)
