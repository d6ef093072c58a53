"""Where the sweep runs: the cluster file (`config`), one module per kind (`local`, `slurm`,
`kubernetes`) and `client`, which opens a `distributed.Client` on the chosen kind.
"""

from importlib import import_module

_EXPORTS = {
    "open_client": "client",
    "describe_cluster": "client",
    "check_store_fits_cluster": "client",
    "ClusterConfig": "config",
    "load_cluster_config": "config",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> object:
    """The public names, each imported from its module on first use."""
    if name in _EXPORTS:
        return getattr(import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
