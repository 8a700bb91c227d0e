"""Moved to `sieverag.inference.metrics.answers` (this path is kept for one release)."""

import sys
import warnings

from sieverag.inference.metrics import answers as _moved

warnings.warn("sieverag.inference.eval.metrics moved to sieverag.inference.metrics.answers",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _moved
