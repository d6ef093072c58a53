"""CPU time of the default sweep's size-matched nulls: qk-head (resolved per model) beside
softmax-b1, 10,000 trials per model and token set. Sizes from the plan alone (token layouts, no
store, no model): all = each input's T, content = T minus its prefix tokens (FT 1: CLS; text and
images taken as 2), one cell per (input, layer), as if every cell tested OK.

    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 PYTHONPATH=. HF_HUB_OFFLINE=1 \
        python benchmarks/qk_head_cost.py
"""
import time
from pathlib import Path

import numpy as np

from sweep.config.load import load_config
from sweep.driver.runner import measured_datasets
from workers.models.registry import resolve_model
from workers.models.token_layout import token_layout
from workers.nulls.baseline import chunk_span
from workers.nulls.matched import SizeHistogram, matched_holding

config = load_config(Path(__file__).parent.parent / "sweep" / "config" / "default.yaml")
datasets = measured_datasets(config)
totals: dict[str, float] = {}
for name, entry in config.models.items():
    spec = resolve_model(entry.source, **entry.options)
    layout = token_layout(spec, datasets[name])
    counts = np.asarray(layout.token_counts(datasets[name].load(range(len(datasets[name]))))
                        if layout.per_input else [layout.tokens] * len(datasets[name]))
    prefix = 1 if spec.family == "ft-transformer" else 2
    sets = {"all": counts, "content": counts - prefix}
    for null in (f"qk-d{layout.head_dim}", "softmax-b1"):
        start = time.process_time()
        for token_set, n in sets.items():
            n = np.repeat(n[n >= 2], layout.n_layers)
            sizes, cells = np.unique(n, return_counts=True)
            h = SizeHistogram(tuple(int(s) for s in sizes), tuple(int(c) for c in cells))
            matched_holding(h, 10_000, chunk_span(10_000, 10_000, 0), model=name,
                            token_set=token_set, null=null, seed=0)
        cost = time.process_time() - start
        key = "qk-head" if null.startswith("qk") else null
        totals[key] = totals.get(key, 0.0) + cost
        print(f"{name:32s} {null:11s} {cost:6.2f} s CPU (T {counts.min()}-{counts.max()}, "
              f"{layout.n_layers} layers)", flush=True)
print({k: round(v, 1) for k, v in totals.items()})
