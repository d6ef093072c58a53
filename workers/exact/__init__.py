"""The exact test: is the layerwise Dobrushin bound tight? What a reader of the paper checks.

`equality.check` tests a stack of row-stochastic matrices (the pruned pair kernel `pruned`, with
`kernel`, `center_bound`, `radius` and `restrict_kernel` beneath it); `readings` holds the other
readings of "content tokens" and `token_kinds` the kinds of token and the token sets; `cells`
fills one input's result cells. Pure math in numpy and numba, no I/O (torch only behind
`check(device=...)`, imported there).
"""

from importlib import import_module

_EXPORTS = {
    "check": "equality",
    "DEFAULT_TOL": "equality",
    "EqualityResult": "equality",
    "restrict_layers": "equality",
    "TokenKind": "token_kinds",
    "TOKEN_SETS": "token_kinds",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> object:
    """The public names, each imported from its module on first use."""
    if name in _EXPORTS:
        return getattr(import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
