"""The `sweep` command line: `entry` (the parser, one line and an exit code per fault), one
module per subcommand in `commands`, and `outputs` (output paths checked before any work).
"""

from importlib import import_module

_EXPORTS = {"main": "entry", "run_command": "entry"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> object:
    """The public names, each imported from its module on first use."""
    if name in _EXPORTS:
        return getattr(import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
