"""Null models: random row-stochastic matrices that observed holding rates are set against.

`registry` holds the named nulls (one `draw(rng, b, n)` each, in `NULLS`), `baseline` the
config-size baseline (a null's holding rate at size n) and `matched` the size-matched nulls (at a
model's own matrix sizes).
"""

import lazy_loader

# The public names, each imported from its module on first use.
__getattr__, __dir__, __all__ = lazy_loader.attach(__name__, submod_attrs={
    "registry": ["NULLS", "get_null", "parse_nulls"],
    "baseline": ["run_baseline"],
})
