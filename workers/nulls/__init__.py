"""Null models: random row-stochastic matrices that observed holding rates are set against.

`registry` holds the named nulls (one `draw(rng, b, n)` each, in `NULLS`), `baseline` the
config-size baseline (a null's holding rate at size n) and `matched` the size-matched nulls (at a
model's own matrix sizes).
"""

from importlib import import_module

_EXPORTS = {
    "NULLS": "registry",
    "get_null": "registry",
    "parse_nulls": "registry",
    "run_baseline": "baseline",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> object:
    """The public names, each imported from its module on first use."""
    if name in _EXPORTS:
        return getattr(import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
