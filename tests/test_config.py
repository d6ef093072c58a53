"""The sweep config: the issue's YAML parses, defaults fill in, every error names its key."""

from __future__ import annotations

from pathlib import Path

import pytest

from storage.errors import InputError
from sweep.config.load import default_config_path, load_config
from workers.exact.equality import DEFAULT_TOL

ISSUE_YAML = """\
store: runs/demo.zarr          # created if missing, resumed if present
shard_size: 32                 # inputs per shard
token_sets: [all, content]     # default: both
datasets:
  sentences: {kind: text, path: data/sentences.txt, limit: 500}
  cancer:    {kind: tabular, source: sklearn:breast_cancer}
models:
  minilm:    {source: "hf:/path/to/local/model", dataset: sentences, batch_size: 16}
  ft-cancer: {source: ft-transformer, dataset: cancer}
baseline: {sizes: [2, 3, 4, 8, 16, 32, 64, 128, 256], trials: 10000, seed: 0}
"""


def write(tmp_path: Path, text: str, name: str = "sweep.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def error_of(tmp_path: Path, text: str) -> str:
    with pytest.raises(InputError) as caught:
        load_config(write(tmp_path, text))
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_issue_example_parses_with_defaults_and_resolved_paths(tmp_path):
    config = load_config(write(tmp_path, ISSUE_YAML))
    assert Path(config.store) == tmp_path / "runs/demo.zarr"
    assert config.datasets["sentences"].path == tmp_path / "data/sentences.txt"
    assert config.datasets["cancer"].source == "sklearn:breast_cancer"
    assert config.baseline.sizes == (2, 3, 4, 8, 16, 32, 64, 128, 256)
    assert config.tol == DEFAULT_TOL and config.retries == 2
    assert str(config.checkpoint_dir) == str(tmp_path / "runs/demo.zarr/.sweep/cache")
    assert config.model_setting("minilm", "batch_size") == 16
    assert config.model_setting("ft-cancer", "batch_size") == config.batch_size
    assert config.datasets["sentences"].to_spec().path == str(tmp_path / "data/sentences.txt")


def test_token_sets_default_to_all_and_content(tmp_path):
    config = load_config(write(tmp_path, "store: s.zarr\n"))
    assert config.token_sets == ("all", "content")


def test_unknown_dataset_names_the_key_and_the_defined_ones(tmp_path):
    message = error_of(tmp_path, ISSUE_YAML.replace("dataset: sentences", "dataset: sentence"))
    assert message == (
        "sweep.yaml: models.minilm.dataset: unknown dataset 'sentence'; defined: cancer, sentences"
    )


@pytest.mark.parametrize(
    ("edit", "key"),
    [
        (("shard_size: 32", "shard_size: -1"), "shard_size"),
        (("shard_size: 32", "shard_sise: 32"), "shard_sise"),
        (("batch_size: 16}", "batch_size: 16, batchsize: 3}"), "models.minilm.batchsize"),
        (("[all, content]", "[all, contents]"), "token_sets"),
        (("trials: 10000", "trials: many"), "baseline.trials"),
        (("sizes: [2, 3,", "sizes: [2, 2,"), "baseline.sizes"),
        (("seed: 0}", "seed: 0, chunk_trials: 1500}"), "baseline.chunk_trials"),
        (("limit: 500", "limit: 0"), "datasets.sentences.limit"),
        (("source: sklearn:breast_cancer", "source: breast_cancer"), "datasets.cancer.source"),
        (("kind: tabular, ", "kind: tabular, path: x.csv, "), "datasets.cancer"),
        (("ft-cancer:", "baseline:"), "models.baseline"),
        (("store: runs/demo.zarr ", "#"), "store"),
        (("{source: ft-transformer, dataset: cancer", "{source: ft-transformer, dataset: cancer, "
          "options: {max_epoch: 4}"), "models.ft-cancer"),
        (("{source: ft-transformer,", "{source: ft-transformr,"), "models.ft-cancer"),
    ],
)
def test_each_error_names_its_key(tmp_path, edit, key):
    message = error_of(tmp_path, ISSUE_YAML.replace(*edit))
    assert message.startswith(f"sweep.yaml: {key}:"), message


def test_kind_is_inferred_from_the_source_or_required(tmp_path):
    config = load_config(write(tmp_path, ISSUE_YAML.replace("kind: tabular, ", "")))
    assert config.datasets["cancer"].to_spec().kind == "tabular"
    message = error_of(tmp_path, ISSUE_YAML.replace("kind: text, path: data/sentences.txt",
                                                    "path: data/sentences.dat"))
    assert message.startswith("sweep.yaml: datasets.sentences.kind: cannot infer")


def test_invalid_yaml_names_the_line(tmp_path):
    message = error_of(tmp_path, "store: a\nmodels: {x: [\n")
    assert message.startswith("sweep.yaml: line ")


def test_missing_file_and_non_mapping(tmp_path):
    with pytest.raises(InputError, match="no such config file"):
        load_config(tmp_path / "absent.yaml")
    assert "mapping" in error_of(tmp_path, "- just\n- a list\n")


def test_config_is_frozen(tmp_path):
    config = load_config(write(tmp_path, ISSUE_YAML))
    with pytest.raises(ValueError):
        config.shard_size = 4


@pytest.mark.parametrize("name", ["default.yaml", "study.yaml"])
def test_bundled_configs_load(name):
    config = load_config(default_config_path().with_name(name), base=Path("/tmp"))
    assert config.models and config.baseline is not None
