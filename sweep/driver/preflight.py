"""Refusals decided before the first byte is written: the store path, the models, the store.

`sweep run` calls `check_cluster` first, then (through `sweep.driver.runner.locked`)
`check_before_lock` before it creates a lock file, trains a checkpoint or opens the store for
writing, and `check_plan_fits_store` once the plan's sizes are known, before any group is created.
`sweep plan` calls the same, in the same order, so it refuses what `sweep run` refuses. So a
refused config leaves every folder as it was: no lock file in a folder that is not a sweep
store, no group for a new model listed beside a changed one, no checkpoint trained for options
the store will not accept.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

import zarr

from storage.errors import InputError, StoreDamagedError
from storage.fingerprint import describe_changes, fingerprint
from storage.layout import BASELINE_GROUP, BOOKKEEPING_DIR, FORMAT, NULLS_GROUP
from storage.location import StoreLike, locate
from storage.store import StoreMismatchError, group_attrs, unfinished_creation
from sweep.clusters.client import ClusterConfig, check_store_fits_cluster
from sweep.clusters.local import check_listen_host
from sweep.config.schema import SweepConfig
from sweep.driver.devices import check_devices
from sweep.driver.plan import baseline_plan, model_config_inputs, with_defaults
from sweep.driver.token_fit import check_tokens_fit
from workers.inputs import open_dataset
from workers.inputs.images import ImageFolder
from workers.models.registry import check_hub_reachable, hub_source, resolve_model

PIXEL_CHECK_ENV = "DOBRUSHIN_PIXEL_CHECK_MIB"
PIXEL_CHECK_MIB = 64.0  # image folders up to this size are decoded before the lock (~2 s)
# fingerprint inputs of a model group that the config alone decides (no model load, no input read)
CONFIG_KEYS = ("model", "tokenizer", "dataset", "shard_size", "token_sets", "tol", "dtype",
               "rollout", "batch_size", "device", "rollout_device")
"""The keys of a model's fingerprint inputs that the config alone decides
(`sweep.driver.plan.config_inputs`; rollout, batch_size, device and rollout_device only when
not the default; tokenizer for tiny text models only)."""


def check_cluster(config: SweepConfig, cluster: ClusterConfig | None) -> None:
    """The cluster the sweep would run on (None: this process, `--in-process`) can reach its
    store (`check_store_fits_cluster`), and this machine has the devices the models name when
    the models run here (`check_devices`; remote workers may have GPUs this machine lacks), and
    a local cluster can listen where it is told to (`check_listen_host`)."""
    if cluster is not None:
        check_store_fits_cluster(cluster, config.store_ref)
        check_listen_host(cluster)
    if cluster is None or cluster.kind == "local":
        check_devices(config)


def check_store_path(store: StoreLike, names: Sequence[str] = ()) -> bool:
    """Whether `store` already is a sweep store; InputError if it is a file, a folder (or
    prefix) holding anything else, or a Zarr store of another kind; StoreDamagedError if its
    root metadata is unreadable; StoreUnreachable (exit 3) or InputError (a missing bucket) if
    an object store cannot be reached. A missing or empty folder or prefix is fine (False), and
    so is what an interrupted creation of a store of models `names` left
    (`storage.store.unfinished_creation`: `sweep run` creates it again)."""
    location = locate(store)
    path = location.local_path()
    if path is not None and path.exists() and not path.is_dir():
        raise InputError(f"store {store}: a file, not a folder; set store: to a new or empty "
                         f"folder, or to an existing sweep store")
    location.probe()
    meta = location.read("zarr.json")
    if meta is None:
        if any(not key.startswith(f"{BOOKKEEPING_DIR}/") for key in
               (location.listing() if location.any_key("") else {})) and \
                not unfinished_creation(location, names):
            raise InputError(f"store {store}: a folder that is not a sweep store; set store: to "
                             f"a new or empty folder, or to an existing sweep store")
        return False
    if path is not None:
        location.listing()  # a link inside the store: StoreDamagedError before the lock
    try:
        attrs = json.loads(meta.decode("utf-8")).get("attributes", {})
    except (UnicodeDecodeError, json.JSONDecodeError, AttributeError) as error:
        raise StoreDamagedError(f"store {store}: its root metadata zarr.json is corrupt "
                                f"({error}); restore it from a backup, or use a new store"
                                ) from None
    if attrs.get("format") != FORMAT:
        raise InputError(f"store {store}: a Zarr store that is not a sweep store (format "
                         f"{attrs.get('format')!r}); set store: to a new or empty folder")
    return True


def check_models(config: SweepConfig) -> None:
    """Every model resolves (source and options), reads a dataset of its own modality and has
    its weights file and its image processor's or tokenizer's files where the driver can see
    them (`hf:` folders: `check_local_weights`, `check_local_preprocessing`); a model read
    from the hub finds it answering, or HF_HUB_OFFLINE set (`check_hub_reachable`)."""
    for name, entry in config.models.items():
        spec = resolve_model(entry.source, **entry.options)
        if hub_source(spec) is not None:
            check_hub_reachable(hub_source(spec), f"models.{name} ({entry.source})")
        kind = config.datasets[entry.dataset].to_spec().kind
        if spec.modality != kind:
            raise InputError(
                f"models.{name}: {entry.source!r} is a {spec.modality} model but dataset "
                f"{entry.dataset!r} is {kind}; point it at a {spec.modality} dataset"
            )
        if spec.family == "hf":
            from workers.models.hf import check_local_preprocessing, check_local_weights

            check_local_weights(spec)
            check_local_preprocessing(spec)


def pixel_check_bytes() -> int:
    """How many bytes of image files `check_inputs` decodes before the lock:
    DOBRUSHIN_PIXEL_CHECK_MIB (MiB; 0: none), else PIXEL_CHECK_MIB."""
    value = os.environ.get(PIXEL_CHECK_ENV)
    try:
        mib = float(value) if value else PIXEL_CHECK_MIB
    except ValueError:
        mib = -1.0
    if not mib >= 0 or mib == float("inf"):
        raise InputError(f"{PIXEL_CHECK_ENV}={value!r}: give the MiB of image files to decode "
                         f"before a run (0: none)")
    return int(mib * (1 << 20))


def check_inputs(config: SweepConfig) -> None:
    """Every image file of the image folders that models read opens as an image (a header read
    each: `workers.inputs.images.check_header`), and the pixels of every file decode when the
    folder's files add up to at most `pixel_check_bytes()` (`ImageFolder.check_pixels`): an
    image damaged past its header is then refused before anything is written; in a larger
    folder it is found by its extraction task (the store stays resumable, and `sweep status`
    names the image)."""
    budget = pixel_check_bytes()
    for name in dict.fromkeys(entry.dataset for entry in config.models.values()):
        spec = config.datasets[name].to_spec()
        if spec.kind == "image" and spec.path is not None:
            dataset = open_dataset(spec)
            if isinstance(dataset, ImageFolder):
                dataset.check_headers()
                if budget and dataset.total_bytes() <= budget:
                    dataset.check_pixels()


def _baseline_inputs(config: SweepConfig) -> dict[str, Any] | None:
    plan = baseline_plan(config)
    return None if plan is None else plan.fingerprint_inputs()


def _finished_groups(store: StoreLike, names: list[str]) -> dict[str, dict[str, Any]]:
    """Fingerprint inputs of the finished groups among `names` and the store's recorded models
    (looked up by name: listing the root would warn about `.sweep`); a group whose metadata
    cannot be read is left out (`sweep.driver.freshness.repair_metadata` recreates it)."""
    root = zarr.open_group(locate(store).zarr_store(read_only=True), mode="r", zarr_format=3,
                           use_consolidated=False)
    out = {}
    for name in dict.fromkeys([*names, *root.attrs.get("models", []), BASELINE_GROUP]):
        attrs = group_attrs(store, name)  # None: absent, or unreadable (`sweep run` repairs it)
        if attrs is not None and "fingerprint" in attrs:
            out[name] = {"fingerprint": attrs["fingerprint"],
                         "inputs": dict(attrs.get("fingerprint_inputs", {}))}
    return out


def _refuse(store: StoreLike, problems: list[tuple[str, list[str]]]) -> None:
    if problems:
        what = "; ".join(f"{who}: {', '.join(lines)}" for who, lines in problems)
        raise StoreMismatchError(
            f"store {store}: computed with a different config ({what}); restore those "
            f"settings, or use a new store"
        )


def check_before_lock(config: SweepConfig, *, read_images: bool = True) -> None:
    """Everything the config alone decides, before the lock file or a checkpoint is written:
    models and their weights files, image headers, the store path, every finished group
    against the config, and edited text inputs against their group's token length
    (`sweep.driver.token_fit`; devices are checked by `sweep run` for local runs:
    `sweep.driver.devices`). `read_images=False` (`sweep plan`, which opens no image) skips
    the image headers and pixels."""
    check_models(config)
    if read_images:
        check_inputs(config)
    if not check_store_path(config.store_ref, list(config.models)):
        return
    groups = _finished_groups(config.store_ref, list(config.models))
    problems = []
    for name in config.models:
        if name in groups:
            planned = model_config_inputs(config, name)
            stored = {k: v for k, v in groups[name]["inputs"].items() if k in CONFIG_KEYS}
            lines = describe_changes(with_defaults(stored), with_defaults(planned))
            if lines:
                problems.append((f"model {name!r}", [f"models.{name}.{x}" for x in lines]))
    baseline = _baseline_inputs(config)
    if baseline is not None and BASELINE_GROUP in groups:
        lines = describe_changes(groups[BASELINE_GROUP]["inputs"], baseline)
        if lines:
            problems.append(("the baseline", [f"baseline.{x}" for x in lines]))
    _refuse(config.store, problems)
    check_tokens_fit(config)


def check_plan_fits_store(store: StoreLike, plan_inputs: dict[str, dict[str, Any]]) -> None:
    """Every planned group (name -> fingerprint inputs; `<model>/nulls` for size-matched nulls)
    against the finished groups, all at once, before any group is created or extended."""
    if locate(store).read("zarr.json") is None:
        return
    groups = _finished_groups(store, list(plan_inputs))
    problems = []
    for name, inputs in plan_inputs.items():
        if name in groups and groups[name]["fingerprint"] != fingerprint(inputs):
            model = name.removesuffix(f"/{NULLS_GROUP}")
            prefix, who = ("baseline.", "the baseline") if name == BASELINE_GROUP else \
                ("matched_nulls.", f"the size-matched nulls of model {model!r}") \
                if model != name else (f"models.{name}.", f"model {name!r}")
            lines = describe_changes(with_defaults(groups[name]["inputs"]), with_defaults(inputs))
            problems.append((who, [prefix + x for x in lines] or ["fingerprint differs"]))
    _refuse(store, problems)
