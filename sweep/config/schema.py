"""The sweep config's schema: frozen pydantic models, one per section, checked key by key.

`SweepConfig` and its sections (datasets, models, baseline, matched nulls) check each key on its
own; reading the file, the checks across keys and the expansions (seed replicates, controls) are
`sweep.config.load`'s. Every error is one line naming the key path of the first problem, e.g.
``sweep.yaml: models.minilm.dataset: unknown dataset 'sentence'; defined: cancer, sentences``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveInt,
    ValidationInfo,
    field_validator,
    model_validator,
)

from storage.attention import AttentionPolicy
from storage.errors import InputError
from storage.layout import BOOKKEEPING_DIR
from storage.location import StoreRef, check_options, check_url, scheme_of
from workers.exact.equality import DEFAULT_TOL
from workers.exact.token_kinds import DEFAULT_TOKEN_SETS, TOKEN_SETS
from workers.inputs import DatasetSpec, infer_kind
from workers.nulls.baseline import BLOCK
from workers.nulls.registry import NULLS, check_sizes_fit, is_per_model, parse_nulls

MAX_TRIAL_TASKS = 100_000  # trial-chunk tasks per baseline, and per model's matched nulls
MAX_TRIALS = 10**8  # trials per baseline (null, size) and per model's (null, token set)
MAX_CHUNK_TRIALS = 10**6  # trials per task: about 21 CPU-minutes at size 256 (1.27 ms a trial)
MAX_MODELS = 1_000  # models per sweep, seed replicates and controls included
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*\Z")  # \Z: `$` lets "rob\n" through
REVISION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")  # a model name's `@rev-<r>` part
# Model names are folder names in a store and parts of its object keys: `baseline` is a group of
# its own, `zarr.json` the root's metadata (compared ignoring case: macOS file systems fold it).
RESERVED_NAMES = frozenset({"baseline", "zarr.json"})
MAX_NAME = 100  # characters of a model or dataset name as written
MAX_MODEL_NAME = 160  # of a generated name (`<name>@seed<k>@random-init`): a path component
# is at most 255 bytes (ext4, APFS) and a store writes `.<name>.XXXXXXXX` temporaries
MESSAGES = {
    "extra_forbidden": "unknown key (check its spelling against the documented keys)",
    "missing": "required key is missing",
}
DEVICE = re.compile(r"^(auto|cpu|cuda(?::\d+)?)\Z")


def check_device_name(device: str) -> str:
    """`device` if it is one the sweep runs on (auto, cpu, cuda, cuda:N); ValueError saying
    which are (a typo would otherwise be fingerprinted into the store)."""
    if not DEVICE.match(device):
        raise ValueError(f"{device!r}: choose auto (CUDA where a worker has it), cpu, cuda or "
                         f"cuda:N")
    return device


Dtype = Literal["float32", "bfloat16", "float16"]
Device = Annotated[str, AfterValidator(check_device_name)]
Rollout = Literal["every", "last", "off"]  # workers.exact.equality.ROLLOUT_MODES (a test checks)
RolloutDevice = Literal["test", "extraction"]


class SampleConfig(BaseModel):
    """`attention: {sample: N, seed: S}`: keep the attention of N inputs per model."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    sample: NonNegativeInt
    seed: NonNegativeInt = 0


Attention = Literal["keep", "drop"] | SampleConfig


def _attention(value: Any) -> Any:
    """`attention:` checked by `storage.attention.AttentionPolicy.parse` (one clear line)."""
    if value is None or isinstance(value, SampleConfig):
        return value
    AttentionPolicy.parse(value)
    return value


def _rollout(value: Any) -> Any:
    """`rollout: off` unquoted is YAML 1.1's false (so are `no` and `false`): read as 'off', for
    this field only. YAML's true (`on`, `yes`, `true`) names no mode: refused, saying to quote
    the mode meant."""
    if value is False:
        return "off"
    if value is True:
        raise ValueError("true (YAML reads on, yes and true unquoted as true): give one of "
                         "'every', 'last' or 'off', in quotes")
    return value


def _resolve(path: Path | None, info: ValidationInfo) -> Path | None:
    """A relative path is relative to the config file's folder (`context["base"]`)."""
    if path is None:
        return None
    base = (info.context or {}).get("base")
    path = Path(path).expanduser()
    return path if path.is_absolute() or base is None else Path(base) / path


def _resolve_store(store: str, info: ValidationInfo) -> str:
    """A store URL (`s3://…`, `memory://…`) as written; a path (or `file://` URL) resolved like
    any path of the config (`_resolve`); InputError for a URL of an unknown scheme."""
    try:
        check_url(store)
    except InputError as error:
        raise ValueError(str(error)) from None
    if scheme_of(store) not in ("", "file"):
        return store
    path = store[len("file://"):] if scheme_of(store) == "file" else store
    return str(_resolve(Path(path), info))


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class DatasetConfig(_Frozen):
    """One dataset: a local `path` or a `source` (`sklearn:...`, `pydoc:topics`, `hf:...`)."""

    kind: Literal["image", "text", "tabular"] | None = None
    path: Path | None = None
    source: str | None = None
    limit: PositiveInt | None = None
    split: str | None = None
    column: str | None = None
    target: str | None = None

    _path = field_validator("path")(_resolve)

    @field_validator("source")
    @classmethod
    def _source_has_scheme(cls, value: str | None) -> str | None:
        if value is not None and ":" not in value:
            raise ValueError(f"source {value!r} needs a scheme such as sklearn:, pydoc: or hf:")
        return value

    def to_spec(self) -> DatasetSpec:
        """The `workers.inputs.DatasetSpec` this entry describes (kind inferred when absent)."""
        fields = self.model_dump(exclude_none=True)
        if self.path is not None:
            fields["path"] = str(self.path)
        fields["kind"] = self.kind or infer_kind(str(self.path or self.source))
        return DatasetSpec(**fields)


class ModelConfig(_Frozen):
    """One model: a source (preset, `hf:`, `timm:`, `ft-transformer`) run on a named dataset."""

    source: str = Field(min_length=1)
    dataset: str
    batch_size: PositiveInt | None = None
    dtype: Dtype | None = None
    device: Device | None = None
    options: dict[str, Any] = Field(default_factory=dict)
    control: Literal["random-init"] | None = None  # adds `<name>@random-init`
    # (sweep.config.controls)
    attention: Attention | None = None  # the sweep's `attention` when None
    seeds: tuple[NonNegativeInt, ...] | None = None  # replicates `<name>@seed<k>`
    # (sweep.config.seeds)
    checkpoints: tuple[NonNegativeInt | Literal["best"], ...] | None = None  # trained here:
    # `<name>@epoch<k>` and `<name>` (best); revision: Hugging Face revisions, `<name>@rev-<r>`
    revision: tuple[str, ...] | None = None  # (sweep.config.checkpoints)

    @field_validator("checkpoints")
    @classmethod
    def _distinct_checkpoints(cls, values: tuple | None) -> tuple | None:
        if values is not None and not values:
            raise ValueError("give at least one checkpoint, or leave `checkpoints` out")
        if values is not None and len(set(values)) != len(values):
            raise ValueError(f"checkpoints repeat a value: {list(values)}")
        return values

    @field_validator("revision", mode="before")
    @classmethod
    def _revisions(cls, value: Any) -> Any:
        values = (value,) if isinstance(value, str) else value
        if values is None:
            return None
        if not values or len(set(values)) != len(values):
            raise ValueError("give distinct revisions (a list), or leave `revision` out")
        for revision in values:
            if not isinstance(revision, str) or not REVISION.match(revision):
                raise ValueError(f"revision {revision!r}: use letters, digits, '_', '.', '-' "
                                 f"(a branch, tag or commit; it becomes part of a model name)")
        return tuple(values)

    _attention = field_validator("attention", mode="before")(_attention)

    @field_validator("seeds")
    @classmethod
    def _distinct_seeds(cls, seeds: tuple[int, ...] | None) -> tuple[int, ...] | None:
        if seeds is not None and not seeds:
            raise ValueError("give at least one seed, or leave `seeds` out")
        if seeds is not None and len(set(seeds)) != len(seeds):
            raise ValueError(f"seeds repeat a value: {list(seeds)}")
        return seeds


def _null_names(value: Any) -> tuple[str, ...]:
    """`nulls:` as a list or comma string of `workers.nulls.registry.NULLS` names, or `all`."""
    try:
        return parse_nulls(value)
    except InputError as error:
        raise ValueError(str(error)) from None


def _whole_blocks(chunk_trials: int) -> int:
    if chunk_trials % BLOCK:
        raise ValueError(f"must be a multiple of {BLOCK} (the baseline's block of trials)")
    if chunk_trials > MAX_CHUNK_TRIALS:
        raise ValueError(
            f"{chunk_trials} trials in one task; at most {MAX_CHUNK_TRIALS} (a task of "
            f"{MAX_CHUNK_TRIALS} trials at size 256 takes about 21 CPU-minutes, and a failed "
            f"task is retried whole)")
    return chunk_trials


def _few_enough_trials(trials: int) -> int:
    if trials > MAX_TRIALS:
        raise ValueError(
            f"{trials} trials; at most {MAX_TRIALS} (the 95% interval's half-width is already "
            f"0.0085 percentage points at p = 0.25, and 35 CPU-hours at size 256)")
    return trials


def _few_enough_tasks(trials: int, chunk_trials: int, cells: int) -> None:
    """ValueError if `cells` x ceil(trials / chunk_trials) trial chunks exceed MAX_TRIAL_TASKS:
    every chunk is a task and a store cell, so the plan would not fit in memory."""
    tasks = cells * -(-trials // chunk_trials)
    if tasks > MAX_TRIAL_TASKS:
        least = -(-cells * trials // (MAX_TRIAL_TASKS * BLOCK)) * BLOCK
        raise ValueError(
            f"{tasks} trial-chunk tasks (more than {MAX_TRIAL_TASKS}); raise chunk_trials to at "
            f"least {least}"
        )


class BaselineConfig(_Frozen):
    """The config-size baseline: `trials` random stochastic matrices per null and size."""

    sizes: tuple[PositiveInt, ...] = Field(min_length=1)
    trials: PositiveInt
    seed: NonNegativeInt = 0
    chunk_trials: PositiveInt = 1000
    nulls: tuple[str, ...] = tuple(NULLS)

    _nulls = field_validator("nulls", mode="before")(_null_names)

    _chunk = field_validator("chunk_trials")(_whole_blocks)
    _trials = field_validator("trials")(_few_enough_trials)

    @field_validator("nulls")
    @classmethod
    def _model_free(cls, nulls: tuple[str, ...]) -> tuple[str, ...]:
        per_model = [name for name in nulls if is_per_model(name)]
        if per_model:
            raise ValueError(f"{per_model[0]!r} takes a model's head dimension: the config-size "
                             "baseline has no model; use qk-d<d> (or put it in matched_nulls)")
        return nulls

    @model_validator(mode="after")
    def _bounded(self) -> BaselineConfig:
        _few_enough_tasks(self.trials, self.chunk_trials, len(self.sizes) * len(self.nulls))
        return self

    @field_validator("sizes")
    @classmethod
    def _unique_sizes(cls, sizes: tuple[int, ...]) -> tuple[int, ...]:
        if len(set(sizes)) != len(sizes):
            raise ValueError(f"sizes repeat a value: {list(sizes)}")
        try:
            check_sizes_fit(sizes)
        except InputError as error:
            raise ValueError(str(error)) from None
        return sizes


class MatchedNullsConfig(_Frozen):
    """Size-matched nulls: per model, token set and null, `trials` matrices drawn at the sizes
    of the model's own tested cells (`workers.nulls.matched`)."""

    nulls: tuple[str, ...] = tuple(NULLS)
    trials: PositiveInt = 10_000  # 95% half-width 0.85 percentage points at p = 0.25
    seed: NonNegativeInt = 0
    chunk_trials: PositiveInt = 10_000

    _nulls = field_validator("nulls", mode="before")(_null_names)
    _chunk = field_validator("chunk_trials")(_whole_blocks)
    _trials = field_validator("trials")(_few_enough_trials)

    @model_validator(mode="after")
    def _bounded(self) -> MatchedNullsConfig:
        _few_enough_tasks(self.trials, self.chunk_trials, len(self.nulls))
        return self


class SweepConfig(_Frozen):
    """A whole sweep. Per-model `batch_size`/`dtype`/`device` override the top-level defaults.

    `rollout` (workers.exact.equality.ROLLOUT_MODES): where the test stage computes the whole
    rollout's kappa(M_l ... M_1) and its product bound: `every` layer (default), the `last`
    layer only (the products still run through every layer; kappa of one product instead of
    L), or `off` (also unquoted: YAML's false); the rollout results are NaN where not computed,
    so a store keeps one setting.
    `rollout_device`: where the rollout's products and their kappa run: in the CPU test task
    (`test`, the default), or in float64 on the extraction's torch device (`extraction`: the
    test task reads the kappa back; they differ from the CPU's by float64 rounding within
    `workers.exact.device_rollout.kappa_bound`, docs/readings.md; the verdicts, each layer's
    kappa and the rollout bound are the CPU's either way).
    """

    store: str  # a path (relative to the config file), or a URL (storage.location)
    storage_options: dict[str, Any] = Field(default_factory=dict)
    shard_size: PositiveInt = 32
    token_sets: tuple[str, ...] = DEFAULT_TOKEN_SETS
    tol: float = Field(default=DEFAULT_TOL, ge=0.0, lt=1.0, allow_inf_nan=False)
    rollout: Rollout = "every"
    rollout_device: RolloutDevice = "test"
    attention: Attention = "keep"  # storage.attention: which inputs keep their attention
    retries: NonNegativeInt = 2
    batch_size: PositiveInt = 8
    dtype: Dtype = "float32"
    device: Device = "auto"
    cache_dir: Path | None = None
    datasets: dict[str, DatasetConfig] = Field(default_factory=dict)
    models: dict[str, ModelConfig] = Field(default_factory=dict)
    baseline: BaselineConfig | None = None
    matched_nulls: MatchedNullsConfig | None = MatchedNullsConfig()

    _store = field_validator("store")(_resolve_store)
    _attention = field_validator("attention", mode="before")(_attention)
    _rollout = field_validator("rollout", mode="before")(_rollout)

    @field_validator("storage_options")
    @classmethod
    def _known_storage_options(cls, options: dict[str, Any]) -> dict[str, Any]:
        try:
            return check_options(options)
        except InputError as error:
            raise ValueError(str(error).removeprefix("storage_options.")) from None
    _cache = field_validator("cache_dir")(_resolve)

    @field_validator("token_sets")
    @classmethod
    def _known_token_sets(cls, sets: tuple[str, ...]) -> tuple[str, ...]:
        if not sets:
            raise ValueError(f"give at least one token set of {sorted(TOKEN_SETS)}")
        for name in sets:
            if name not in TOKEN_SETS:
                raise ValueError(f"unknown token set {name!r}; choose from {sorted(TOKEN_SETS)}")
        if len(set(sets)) != len(sets):
            raise ValueError(f"token sets repeat a value: {list(sets)}")
        return sets

    @property
    def store_ref(self) -> StoreRef:
        """The store with its storage options (what tasks carry: no credential is in it)."""
        return StoreRef.of(self.store, self.storage_options)

    @property
    def checkpoint_dir(self) -> StoreRef:
        """Where trained checkpoints (FT-Transformer) live: `cache_dir`, else inside the store
        (a folder or a URL with the store's options: `storage.location`)."""
        if self.cache_dir is not None:
            return StoreRef.of(self.cache_dir)
        return StoreRef.of(f"{self.store.rstrip('/')}/{BOOKKEEPING_DIR}/cache",
                           self.storage_options)

    def model_setting(self, name: str, key: Literal["batch_size", "dtype", "device"]) -> Any:
        """A model's own setting, or the sweep-wide default when the model does not set it."""
        value = getattr(self.models[name], key)
        return getattr(self, key) if value is None else value

    def attention_policy(self, name: str) -> AttentionPolicy:
        """Model `name`'s attention policy: its own `attention`, else the sweep's."""
        value = self.models[name].attention
        value = self.attention if value is None else value
        return AttentionPolicy.parse(value.model_dump() if isinstance(value, SampleConfig)
                                     else value)

    def resolved(self) -> dict[str, Any]:
        """The config as plain JSON data, every default filled in."""
        return self.model_dump(mode="json")


def _shown(name: str) -> str:
    shown = name if len(name) <= 40 else f"{name[:40]}..."
    return shown if shown.isprintable() else repr(shown)  # a newline, a control: named


def check_name(section: str, name: str) -> None:
    """InputError unless `name` is usable as a folder and object-key name on every backend (a
    local folder, S3, GCS, Azure): letters, digits, '_', '.', '-', starting with a letter or
    digit (so never `.sweep` or another hidden name, never a path separator), not ending in
    '.' (Azure and some file systems drop it), at most MAX_NAME characters, not a name the
    store uses itself (RESERVED_NAMES, ignoring case)."""
    why = None
    if len(name) > MAX_NAME:
        why = f"{len(name)} characters, at most {MAX_NAME}"
    elif not NAME.match(name):
        why = "use only letters, digits, '_', '.', '-', starting with a letter or digit"
    elif name.endswith("."):
        why = "it ends with '.', which some stores drop"
    elif name.lower() in RESERVED_NAMES:
        why = f"the store uses the name {name.lower()!r} itself"
    if why is not None:
        raise InputError(f"{section}.{_shown(name)}: invalid name ({why}); rename it (names "
                         f"become folders and object keys of the store)")


def check_model_names(names: list[str]) -> None:
    """InputError if a generated model name (seed replicates, controls) is too long for a
    folder, or if two model names differ only in case (their folders would be one on a file
    system that ignores case: macOS's and Windows' by default)."""
    seen: dict[str, str] = {}
    for name in names:
        if len(name) > MAX_MODEL_NAME:
            raise InputError(f"models.{_shown(name)}: a generated name of {len(name)} characters, "
                             f"at most {MAX_MODEL_NAME}; shorten the model's name or its seeds")
        other = seen.setdefault(name.lower(), name)
        if other != name:
            raise InputError(f"models.{_shown(name)}: differs from models.{_shown(other)} only in "
                             f"case, so both would be one folder on a file system that ignores "
                             f"case (macOS, Windows); rename one")
