"""What runs inside tasks: plain functions of frozen specs, no Dask in here.

One package per job, lowest first (each imports only those above it in this list, and `storage`):

- `exact`: the exact test, what a reader of the paper checks: kappa, the equality test, the
  decision radius and the readings of "content tokens", in numba with float64 oracles
- `inputs`: datasets of inputs with stable ids, and their content digests
- `nulls`: random stochastic matrices set against observed rates: the named nulls, the
  config-size baseline and the size-matched nulls
- `models`: the model registry (frozen specs, presets), the family adapters and extraction

On top, the task layer: `task_specs` (the frozen specs the driver's plan builds) and `tasks` (the
bodies that run them on a worker and write the store: `tasks.extract` imports torch, the CPU
pool's `tasks.verdicts` and `tasks.nulls` never do).
"""
