"""The driver: config -> plan -> store -> pending tasks -> an executor, on a laptop or a login node.

It plans from specs alone (`plan`, `token_fit`, `freshness`), refuses what the config alone
decides before the lock (`preflight`, `devices`, `weights`, `bounded`), creates the store and
runs what is not done (`runner`: the in-process executor; `graph`: the Dask one). It never builds
a model, decodes an input or trains: every per-input and per-model step is a task
(`workers.tasks`). `balance` sizes the CPU pool against the GPU pool for `sweep plan`.
"""

from importlib import import_module

_EXPORTS = {
    "build_plan": "plan",
    "materialise": "runner",
    "run_sweep": "runner",
    "InProcessExecutor": "runner",
    "DaskExecutor": "graph",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> object:
    """The public names, each imported from its module on first use."""
    if name in _EXPORTS:
        return getattr(import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
