"""The task specs: small frozen dataclasses, one per kind of task, that the sweep's plan builds
(`sweep.driver.plan`) and `workers.tasks` runs. Each carries its key, its store, what it computes,
its Dask resource (`GPU` for preparation and extraction, `CPU` for the rest), and the name of its
completion marker (`scope`/`marker`, `storage.markers`). No weights, no data: they travel in the
graph.
"""

from __future__ import annotations

from dataclasses import dataclass

from storage.layout import BASELINE_GROUP, BASELINE_STAGE, NULLS_STAGE, PREPARE_STAGE
from storage.location import StoreRef
from storage.markers import marker_name
from workers.exact.equality import ROW_SUM_TOL
from workers.inputs import DatasetSpec
from workers.models.registry import ModelSpec
from workers.nulls.baseline import BlockSpan


def baseline_index(null: str, n: int, chunk: int) -> str:
    """`uniform-n0008-c00002`: a config-size baseline chunk's name in keys and markers."""
    return f"{null}-n{n:04d}-c{chunk:05d}"



@dataclass(frozen=True)
class ModelTask:
    """What every task of one model has: its key, its store and the model, whose marker folder
    (`scope`) holds its completion markers."""

    key: str
    store: StoreRef  # storage.location: a path or URL with its storage options
    model: str

    @property
    def scope(self) -> str:
        return self.model


@dataclass(frozen=True)
class ShardTask(ModelTask):
    """What every per-(model, shard) task has besides: its shard and input range."""

    shard: int
    start: int
    stop: int

    @property
    def marker(self) -> str:
        return marker_name(self.stage, self.shard)


@dataclass(frozen=True)
class ExtractTask(ShardTask):
    """Extract one shard of a model's inputs and write attention, n_tokens and token kinds."""

    spec: ModelSpec
    dataset: DatasetSpec
    batch_size: int
    device: str
    dtype: str
    cache_dir: StoreRef
    digests: tuple[str, ...] = ()  # workers.inputs.digests of the shard's inputs, as the driver saw
    # them
    device_rollout: str = "off"  # ROLLOUT_MODES: the rollout kappa this task computes on its
    # device for the test task (`rollout_device: extraction`); off: none

    stage = "extract"
    resources = {"GPU": 1}


@dataclass(frozen=True)
class TestTask(ShardTask):
    """Test one shard: read its attention back, write results for every token set + rollout."""

    token_sets: tuple[str, ...]
    tol: float
    rollout: str = "every"  # workers.exact.equality.ROLLOUT_MODES: where the rollout's kappa is
    # computed
    drop: tuple[int, ...] = ()  # inputs whose attention is deleted once tested (attention: policy)
    row_sum_tol: float = ROW_SUM_TOL  # how far a row may miss 1: `row_sum_tolerance` of the
    # extraction dtype
    device_rollout: bool = False  # read the rollout kappa the extraction stored instead of
    # computing the products (`rollout_device: extraction`)

    stage = "test"
    resources = {"CPU": 1}
    __test__ = False  # not a pytest class


@dataclass(frozen=True)
class PrepareTask(ModelTask):
    """Prepare one model before its extractions (train FT-Transformer into the checkpoint cache)
    and keep the training record in the store (`storage.store.write_training_record`)."""

    spec: ModelSpec
    dataset: DatasetSpec
    cache_dir: StoreRef

    stage = PREPARE_STAGE
    resources = {"GPU": 1}

    @property
    def marker(self) -> str:
        return self.stage


@dataclass(frozen=True)
class BaselineTask:
    """Count holding matrices among one chunk of one (null, size)'s trials."""

    key: str
    store: StoreRef  # storage.location: a path or URL with its storage options
    size_index: int
    n: int
    chunk: int
    blocks: BlockSpan  # (block index, trials) of workers.nulls.baseline, lazily
    seed: int
    tol: float
    null: str = "uniform"
    null_index: int = 0

    stage = BASELINE_STAGE
    resources = {"CPU": 1}
    scope = BASELINE_GROUP

    @property
    def marker(self) -> str:
        return marker_name(self.stage, baseline_index(self.null, self.n, self.chunk))


@dataclass(frozen=True)
class NullTask(ModelTask):
    """Size-matched null draws of one (model, null, trial chunk), every token set of the model:
    reads the model's tested sizes (so it waits for all its test tasks), writes the counts."""

    null: str
    null_index: int
    chunk: int
    blocks: BlockSpan
    token_sets: tuple[str, ...]
    seed: int
    tol: float

    stage = NULLS_STAGE
    resources = {"CPU": 1}

    @property
    def marker(self) -> str:
        return marker_name(self.stage, f"{self.null}-c{self.chunk:05d}")


Task = PrepareTask | ExtractTask | TestTask | BaselineTask | NullTask
