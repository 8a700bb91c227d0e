"""Moved to `sieverag.inference.pipelines.auto.router` (this path is kept for one release)."""

import sys
import warnings

from sieverag.inference.pipelines.auto import router as _moved

warnings.warn("sieverag.inference.pipelines.router moved to "
              "sieverag.inference.pipelines.auto.router",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _moved
