"""Moved to `sieverag.inference.pipelines.amber.memory` (this path is kept for one release)."""

import sys
import warnings

from sieverag.inference.pipelines.amber import memory as _moved

warnings.warn("sieverag.inference.pipelines.memory moved to "
              "sieverag.inference.pipelines.amber.memory",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _moved
