"""Moved to `sieverag.inference.pipelines.amber.trace` (this path is kept for one release)."""

import sys
import warnings

from sieverag.inference.pipelines.amber import trace as _moved

warnings.warn("sieverag.inference.pipelines.amber_trace moved to "
              "sieverag.inference.pipelines.amber.trace",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _moved
