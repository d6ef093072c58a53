"""The `sweep` command line: `entry` (the parser, one line and an exit code per fault), one
module per subcommand in `commands`, and `outputs` (output paths checked before any work).
"""

import lazy_loader

# The public names, each imported from its module on first use.
__getattr__, __dir__, __all__ = lazy_loader.attach(__name__, submod_attrs={
    "entry": ["main", "run_command"],
})
