"""The exact test: is the layerwise Dobrushin bound tight? What a reader of the paper checks.

`equality.check` tests a stack of row-stochastic matrices (the pruned pair kernel `pruned`, with
`kernel`, `center_bound`, `radius` and `restrict_kernel` beneath it); `readings` holds the other
readings of "content tokens" and `token_kinds` the kinds of token and the token sets; `cells`
fills one input's result cells. Pure math in numpy and numba, no I/O (torch only behind
`check(device=...)`, imported there).
"""

import lazy_loader

# The public names, each imported from its module on first use.
__getattr__, __dir__, __all__ = lazy_loader.attach(__name__, submod_attrs={
    "equality": ["check", "DEFAULT_TOL", "EqualityResult", "restrict_layers"],
    "token_kinds": ["TokenKind", "TOKEN_SETS"],
})
