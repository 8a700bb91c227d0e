"""`python -m sieverag` runs the command line."""

import sys

from sieverag.cli import main

sys.exit(main())
