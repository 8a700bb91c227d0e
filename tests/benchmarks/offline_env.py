"""How every benchmark script runs: offline (models and tokenizers from the local cache or the
embedded packages, never downloaded) and with the tokenizers' own thread pool off, so a
benchmark's threads are its own. A variable already set wins, as in the Makefile and
tests/conftest.py. Call `run_offline()` before importing anything that reads them
(huggingface_hub and transformers read them on import)."""

from __future__ import annotations

import os

OFFLINE_ENVIRONMENT = {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def run_offline() -> None:
    """Set each of OFFLINE_ENVIRONMENT's variables that is not set already."""
    for name, value in OFFLINE_ENVIRONMENT.items():
        os.environ.setdefault(name, value)
