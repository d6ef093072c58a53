"""Edited text inputs against a store's token length: refused before the lock, in one line.

A model group's arrays are sized once, when the group is created, for the most real tokens of
any input then (`t_max`). A text line edited since under the same id (`sweep.driver.freshness`
notices it and recomputes its shard) may need more tokens than that: it can never be stored. The
driver sees it cheaply before the lock: only the inputs whose recorded digest differs from today's
(an edited input, or one whose shard never ran) are tokenized; a finished store whose inputs did not
change tokenizes nothing. Images and tables have one token count per model (`TokenLayout`), so
only models whose token counts depend on the input are checked. A store from before digests
(no `input_digest`) is not checked here; its extraction task refuses the input in the same line
(`workers.tasks.shards.too_many_tokens`).
"""

from __future__ import annotations

from storage.integrity import metadata_damage
from storage.store import open_root, stored_model_attrs
from sweep.config.schema import SweepConfig
from sweep.driver.freshness import measured_datasets, plan_digests
from workers.models.registry import resolve_model
from workers.models.token_layout import token_layout
from workers.tasks.shards import too_many_tokens

BATCH = 256  # inputs per tokenizer call


def changed_inputs(recorded: list[str], today: tuple[str, ...]) -> list[int]:
    """Indices of the inputs whose recorded digest is not today's (empty: never extracted)."""
    return [i for i, (was, now) in enumerate(zip(recorded, today, strict=True)) if was != now]


def check_tokens_fit(config: SweepConfig) -> None:
    """InputError (`too_many_tokens`: the model, the first input, its tokens, the group's t_max
    and what to do) if an input of a model already in the store needs more tokens than the
    model's group holds. Reads the store, writes nothing."""
    sized = {}
    for name, entry in config.models.items():
        if config.datasets[entry.dataset].to_spec().kind != "text":
            continue
        attrs = stored_model_attrs(config.store_ref, name)
        if attrs is not None:
            sized[name] = attrs["t_max"]
    for damage in metadata_damage(config.store_ref, sized):  # `sweep run` recreates them
        sized.pop(damage.scope, None)
    if not sized:
        return
    root = open_root(config.store_ref)
    datasets = measured_datasets(config, sized)
    digests = plan_digests(config, datasets)
    for name, t_max in sized.items():
        group = root[name]
        if "input_digest" not in group:
            continue  # a store from before digests
        dataset = datasets[name]
        recorded = [str(d) for d in group["input_digest"][:]]
        if len(recorded) != len(dataset):
            continue  # other inputs: the fingerprint refuses it (`check_plan_fits_store`)
        changed = changed_inputs(recorded, digests[name])
        if not changed:
            continue
        entry = config.models[name]
        layout = token_layout(resolve_model(entry.source, **entry.options), dataset)
        if not layout.per_input:
            continue
        over = []
        for first in range(0, len(changed), BATCH):
            indices = changed[first:first + BATCH]
            counts = layout.token_counts(dataset.load(indices))
            over += [(i, c) for i, c in zip(indices, counts, strict=True) if c > t_max]
        if over:
            index, tokens = over[0]
            raise too_many_tokens(name, dataset.ids[index], tokens, t_max, config.store,
                                  more=len(over) - 1)
