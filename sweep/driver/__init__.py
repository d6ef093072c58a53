"""The driver: config -> plan -> store -> pending tasks -> an executor, on a laptop or a login node.

It plans from specs alone (`plan`, `token_fit`, `freshness`), refuses what the config alone
decides before the lock (`preflight`, `devices`, `weights`, `bounded`), creates the store and
runs what is not done (`runner`: the in-process executor; `graph`: the Dask one). It never builds
a model, decodes an input or trains: every per-input and per-model step is a task
(`workers.tasks`). `balance` sizes the CPU pool against the GPU pool for `sweep plan`.
"""

import lazy_loader

# The public names, each imported from its module on first use.
__getattr__, __dir__, __all__ = lazy_loader.attach(__name__, submod_attrs={
    "plan": ["build_plan"],
    "runner": ["materialise", "run_sweep", "InProcessExecutor"],
    "graph": ["DaskExecutor"],
})
