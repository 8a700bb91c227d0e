"""The `sieverag` command line (placeholder, replaced below)."""
from sieverag.inference.cli import main  # noqa: F401
