"""Moved to `sieverag.inference.pipelines.amber.settings` (this path is kept for one release)."""

import sys
import warnings

from sieverag.inference.pipelines.amber import settings as _moved

warnings.warn("sieverag.inference.pipelines.amber_config moved to "
              "sieverag.inference.pipelines.amber.settings",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _moved
