"""Moved to `sieverag.inference.metrics.filter` (this path is kept for one release)."""

import sys
import warnings

from sieverag.inference.metrics import filter as _moved

warnings.warn("sieverag.inference.eval.filter_metrics moved to sieverag.inference.metrics.filter",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _moved
