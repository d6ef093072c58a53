"""Reading a sweep config: YAML -> the schema -> the checks across keys -> the expansions.

`load_config(path)` reads a file (the one YAML reader, `sweep.config.yaml_io`: UTF-8 checked,
duplicate keys refused); `parse_config(data)` validates the parsed data key by key against the
schema (`sweep.config.schema.SweepConfig`), checks what spans keys (names, the dataset each model
names, each model's source and options), then expands `seeds` into `<name>@seed<k>` models
(`sweep.config.seeds`) and controls into `<name>@random-init` models (`sweep.config.controls`).
This module imports the schema and both expansions, so none of them imports another.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from storage.errors import InputError
from sweep.config.checkpoints import expand_checkpoints
from sweep.config.controls import control_name, expand_controls
from sweep.config.schema import (
    MAX_MODELS,
    MESSAGES,
    ModelConfig,
    SweepConfig,
    check_model_names,
    check_name,
)
from sweep.config.seeds import expand_seeds, seed_name
from sweep.config.yaml_io import load_yaml, read_text
from workers.inputs import infer_kind
from workers.models.registry import check_heads, resolve_model
from workers.models.token_layout import needs_preparation


def _key_path(loc: tuple[Any, ...]) -> str:
    return ".".join(str(part) for part in loc) or "(top level)"


def _check_source(name: str, model: ModelConfig) -> None:
    """The model's source and options resolve to a spec (preset names, option names and values),
    at load. A hub id whose modality must be read from the hub is left to `sweep.driver.preflight`,
    which runs before anything is written (loading a config reaches no network)."""
    source = model.source.strip()
    try:
        check_heads(source, model.options.get("heads", "mean"))
        if source.startswith("hf:") and "modality" not in model.options \
                and not Path(source[3:]).expanduser().is_dir():
            return
        resolve_model(source, **model.options)
    except InputError as error:
        raise InputError(f"models.{name}: {error}") from None


def _check_references(config: SweepConfig) -> None:
    """Names are usable as Zarr group names and every model names a defined dataset."""
    for section in ("datasets", "models"):
        for name in getattr(config, section):
            check_name(section, name)
    for name, model in config.models.items():
        if model.dataset not in config.datasets:
            defined = ", ".join(sorted(config.datasets)) or "none"
            raise InputError(
                f"models.{name}.dataset: unknown dataset {model.dataset!r}; defined: {defined}"
            )
        _check_source(name, model)
    for name, dataset in config.datasets.items():
        if (dataset.path is None) == (dataset.source is None):
            raise InputError(f"datasets.{name}: give exactly one of 'path' or 'source'")
        if dataset.kind is None and infer_kind(str(dataset.path or dataset.source)) is None:
            raise InputError(
                f"datasets.{name}.kind: cannot infer the kind of {dataset.path or dataset.source}; "
                f"set kind: image, text or tabular"
            )


def parse_config(data: Any, base: Path | None = None) -> SweepConfig:
    """Validate already-parsed YAML data; relative paths resolve against `base`."""
    if not isinstance(data, dict):
        raise InputError(f"expected a mapping at the top level, got {type(data).__name__}")
    try:
        config = SweepConfig.model_validate(data, context={"base": base})
    except ValidationError as error:
        first = error.errors()[0]
        message = MESSAGES.get(first["type"], first["msg"])
        raise InputError(f"{_key_path(first['loc'])}: {message}") from None
    _few_enough_models(len(config.models))
    _check_references(config)
    trained = _trained_models(config)
    expanded = expand_checkpoints(expand_controls(expand_seeds(config, trained)),
                                  _trained_expanded(config, trained))
    _check_epochs(expanded)
    _few_enough_models(len(expanded.models), " (seed replicates and controls included)")
    check_model_names(list(expanded.models))
    return expanded


def _few_enough_models(count: int, which: str = "") -> None:
    """InputError if a sweep lists more than MAX_MODELS models: the driver plans every model
    in memory before any task runs."""
    if count > MAX_MODELS:
        raise InputError(
            f"models: {count} models{which}; at most {MAX_MODELS} in one sweep (the driver "
            f"plans them all before any task runs: 1,000 took 18 s, 10,000 took 5 minutes); "
            f"split them over several sweep configs")


def _trained_models(config: SweepConfig) -> list[str]:
    """The entries with `seeds` or `checkpoints` whose models the project trains
    (`needs_preparation`)."""
    return [name for name, entry in config.models.items()
            if (entry.seeds is not None or entry.checkpoints is not None)
            and needs_preparation(resolve_model(entry.source, **entry.options))]


def _check_epochs(config: SweepConfig) -> None:
    """InputError naming the first checkpoint model whose options its family refuses (an epoch
    past the last one trained), before anything is planned."""
    for name, entry in config.models.items():
        if "checkpoint" in entry.options:
            try:
                resolve_model(entry.source, **entry.options)
            except InputError as error:
                raise InputError(f"models.{name}.checkpoints: {error}") from None


def _trained_expanded(config: SweepConfig, trained: list[str]) -> list[str]:
    """`trained` with each entry's seed replicates and controls (the names `expand_seeds` and
    `expand_controls` give them)."""
    out = []
    for name in trained:
        seeds = config.models[name].seeds
        for model in [seed_name(name, s) for s in seeds] if seeds else [name]:
            out += [model, control_name(model)]
    return out


def load_config(path: str | Path, base: Path | None = None) -> SweepConfig:
    """Read a sweep YAML file into a `SweepConfig`; every error is one line naming file and key.

    Relative paths resolve against `base`, by default the file's folder.
    """
    path = Path(path)
    try:
        text = read_text(path)
    except FileNotFoundError:
        raise InputError(f"{path}: no such config file") from None
    try:
        data = load_yaml(text, path.name)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(error, "problem", None) or "invalid YAML"
        raise InputError(f"{path.name}:{where}: {problem}") from None
    try:
        return parse_config(data, base=base or path.resolve().parent)
    except InputError as error:
        raise InputError(f"{path.name}: {error}") from None


def default_config_path() -> Path:
    """The bundled default sweep (offline; about 7 minutes on 2 cores, FT training included)."""
    return Path(__file__).parent / "default.yaml"
