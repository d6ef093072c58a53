"""Deprecated import path: `workers.equality` moved to `workers.exact.equality` (issue 27).

Importing this gives `workers.exact.equality` itself (patching it patches the real module)
and warns once.
"""

import sys
import warnings

from workers.exact import equality as _moved

warnings.warn("workers.equality moved to workers.exact.equality: import it from there",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _moved
