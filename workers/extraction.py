"""Deprecated import path: `workers.extraction` moved to `workers.models.extraction` (issue 27).

Importing this gives `workers.models.extraction` itself (patching it patches the real module)
and warns once.
"""

import sys
import warnings

from workers.models import extraction as _moved

warnings.warn("workers.extraction moved to workers.models.extraction: import it from there",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _moved
