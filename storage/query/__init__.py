"""Reading a sweep store: its results as an `xarray.DataTree`, holding rates, nulls and status.

`results` opens a store lazily and reduces verdicts to holding rates (`open_results`,
`holding_rates`, the public entry points); `nulls` reads the config-size baseline and the
size-matched nulls; `counts` sums verdicts per group and divides once; `statistics` (Wilson and t
intervals) and `bootstrap` (the per-input cluster bootstrap) are the pure interval math the
report shares; `status` says what a store holds from its markers. Nothing here writes.
"""

import lazy_loader

# The public names, each imported from its module on first use.
__getattr__, __dir__, __all__ = lazy_loader.attach(__name__, submod_attrs={
    "results": ["open_results", "holding_rates", "cells"],
})
