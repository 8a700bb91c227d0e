"""Moved to `sieverag.inference.metrics.retrieval` (this path is kept for one release)."""

import sys
import warnings

from sieverag.inference.metrics import retrieval as _moved

warnings.warn("sieverag.inference.eval.retrieval moved to sieverag.inference.metrics.retrieval",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _moved
