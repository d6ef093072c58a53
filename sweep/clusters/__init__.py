"""Where the sweep runs: the cluster file (`config`), one module per kind (`local`, `slurm`,
`kubernetes`) and `client`, which opens a `distributed.Client` on the chosen kind.
"""

import lazy_loader

# The public names, each imported from its module on first use.
__getattr__, __dir__, __all__ = lazy_loader.attach(__name__, submod_attrs={
    "client": ["open_client", "describe_cluster", "check_store_fits_cluster"],
    "config": ["ClusterConfig", "load_cluster_config"],
})
