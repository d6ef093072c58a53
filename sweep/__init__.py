"""dobrushin-sweep: when is the layerwise Dobrushin bound on attention rollout tight?

`sweep` owns configuration, the graph, the cluster, the command line and reports, in one package
per job, lowest first (each imports only those above it in this list, and `workers`, `storage`):

- `terminal`: what reaches the terminal: one line and an exit code per fault, Ctrl-C, Dask's logs
- `config`: the sweep config, YAML parsed once into frozen pydantic models, and its expansions
- `clusters`: where the sweep runs: the cluster file, one module per kind, the Dask client
- `driver`: the plan, the store created from it, what is pending, executors (in process, Dask)
- `report`: the study's tables from a store, the findings, the figures, their renderings
- `show`: one input up close, from the store alone
- `cli`: the `sweep` command, one module per subcommand

docs/architecture.md follows one shard through them.
"""
