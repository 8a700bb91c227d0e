"""`python -m sieverag.training.sft`, the module `accelerate launch` runs on every rank: the
trainer's `main` over the command line's recipe and flags."""

import sys

from sieverag.training.sft.trainer import main

sys.exit(main())
