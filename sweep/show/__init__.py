"""One input up close, from the store alone (`sweep show`): per layer its verdict and the pair
attaining kappa (`view`), a heat map of one layer (`figure`), and what the input was (`source`).
"""

import lazy_loader

# The public names, each imported from its module on first use.
__getattr__, __dir__, __all__ = lazy_loader.attach(__name__, submod_attrs={
    "view": ["read_input", "render_table"],
})
