"""The adapter base of a family trained here: its checkpoint, read from the cache or trained and
written there first, its training record (`prepare`) and the rows it is measured on.

A family subclasses `TrainedFamily` with its dataset check (`table`), the options outside its
checkpoint's key (`measurement_only`) and its recipe's module (`recipe`: a module whose
`train(spec, table, keep, run)` returns the kept weights, the weights after each epoch of `keep`
and the training record, writing through `run` as it goes: `workers.models.trained.run`); its
adapter module binds `prepare` and `model_dataset` from an instance. A random-init control is
never trained (its weights are the recipe's initial ones). A run killed while it trained resumes
from its last resume point, if it wrote one.
"""

from __future__ import annotations

import importlib
from typing import Any

from storage.errors import InputError
from storage.location import StoreLike, locate
from workers.inputs import Dataset, Table
from workers.models.determinism import dispatch
from workers.models.registry import ModelSpec
from workers.models.trained.cache import (
    State,
    checkpoint_key,
    epoch_key,
    read_record,
    read_weights,
    record_key,
    write_run,
)
from workers.models.trained.options import kept_epochs, training_options
from workers.models.trained.run import Reporter, TrainingRun
from workers.models.trained.split import model_rows


class TrainedFamily:
    """What every family trained here does the same way (see the module)."""

    measurement_only: tuple[str, ...] = ()
    recipe: str = ""  # the module of the family's `train(spec, table, keep, run)`

    def table(self, spec: ModelSpec, dataset: Dataset | None) -> Table:
        """The table `spec` trains on; InputError naming the dataset it needs."""
        raise NotImplementedError

    def checkpoint_key(self, spec: ModelSpec, table: Table) -> str:
        """The kept weights' name in the cache (`workers.models.trained.cache`)."""
        return checkpoint_key(spec, table, training_options(spec.options, self.measurement_only))

    def train(self, spec: ModelSpec, table: Table, keep: set[int],
              run: TrainingRun) -> tuple[State, dict[int, State], dict[str, Any]]:
        """The recipe's `train`, looked up when called (tests replace it)."""
        return importlib.import_module(self.recipe).train(spec, table, keep, run)

    def ensure_checkpoint(self, spec: ModelSpec, dataset: Dataset | None, cache: StoreLike,
                          report: Reporter | None = None) -> tuple[State, dict[str, Any]]:
        """The weights `spec` measures (its `checkpoint`, else the kept ones) and the training
        record, from the cache, or trained and written there first (the missing epochs as they
        are reached, the record, then the kept weights; `report`: where its progress goes).
        InputError for a control, or for an epoch past the last one trained (early
        stopping)."""
        table = self.table(spec, dataset)
        if spec.random_init:
            raise InputError(f"model {spec.name!r} is a random-init control: it has no checkpoint")
        location, key = locate(cache), self.checkpoint_key(spec, table)
        keep = kept_epochs(spec.options)
        best = read_weights(location, key, also=f"and {record_key(key)} ")
        record = read_record(location, key)
        epochs = {e: read_weights(location, epoch_key(key, e)) for e in keep}
        if best is None or record is None or any(state is None for state in epochs.values()):
            missing = {e for e, state in epochs.items() if state is None}
            run = TrainingRun(location, key, table, missing, report)
            best, trained, record = self.train(spec, table, keep, run)
            record = {**record, "dispatch": dispatch()}
            write_run(location, key, table, best, record)
            run.clear()
            epochs = {**epochs, **trained}
        checkpoint = spec.options.get("checkpoint")
        if checkpoint is None:
            return best, record
        if epochs.get(checkpoint) is None:
            raise InputError(f"model {spec.name!r}: checkpoint epoch {checkpoint} is past the "
                             f"last epoch trained ({record['epochs_run']}, stopped by "
                             f"{record['stopped_by']}); choose epochs up to it")
        return epochs[checkpoint], record

    def prepare(self, spec: ModelSpec, dataset: Dataset | None, cache: StoreLike,
                report: Reporter | None = None) -> dict[str, Any] | None:
        """Train (or find cached) the model of `spec`, its progress to `report`; its training
        record, or None for a control."""
        self.table(spec, dataset)
        if spec.random_init:
            return None
        return self.ensure_checkpoint(spec, dataset, cache, report)[1]

    def model_dataset(self, spec: ModelSpec, dataset: Dataset) -> Dataset:
        """The inputs `spec` is measured on: the test rows of its split (`split: test`) or every
        row (`split: all`), ascending, with the dataset's own ids; then the dataset's `limit`.
        Pure: from the spec and the table alone, no training (the driver plans with it)."""
        return dataset.subset(model_rows(spec.options, spec.seed, self.table(spec, dataset)))
