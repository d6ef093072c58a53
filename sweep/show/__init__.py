"""One input up close, from the store alone (`sweep show`): per layer its verdict and the pair
attaining kappa (`view`), a heat map of one layer (`figure`), and what the input was (`source`).
"""

from importlib import import_module

_EXPORTS = {"read_input": "view", "render_table": "view"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> object:
    """The public names, each imported from its module on first use."""
    if name in _EXPORTS:
        return getattr(import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
