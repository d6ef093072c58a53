"""Reading a sweep store: its results as an `xarray.DataTree`, holding rates, nulls and status.

`results` opens a store lazily and reduces verdicts to holding rates (`open_results`,
`holding_rates`, the public entry points); `nulls` reads the config-size baseline and the
size-matched nulls; `counts` sums verdicts per group and divides once; `statistics` (Wilson and t
intervals) and `bootstrap` (the per-input cluster bootstrap) are the pure interval math the
report shares; `status` says what a store holds from its markers. Nothing here writes.
"""

from importlib import import_module

_EXPORTS = {
    "open_results": "results",
    "holding_rates": "results",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> object:
    """The public names, each imported from its module on first use."""
    if name in _EXPORTS:
        return getattr(import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
