"""Moved to `sieverag.inference.pipelines.amber.collector` (this path is kept for one release)."""

import sys
import warnings

from sieverag.inference.pipelines.amber import collector as _moved

warnings.warn("sieverag.inference.pipelines.collector moved to "
              "sieverag.inference.pipelines.amber.collector",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _moved
