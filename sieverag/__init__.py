"""sieverag: filter what a RAG generator reads.

The package's parts live in the repository's top-level folders and install under this name:
`sieverag.inference` (the runtime), `sieverag.data_gen` (labelling), `sieverag.training`
(LoRA SFT of the filter) and `sieverag.serving` (vLLM launcher, embedded server).
`sieverag.cli` is the command line; it imports a command's code only when that command runs.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("sieverag")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0.0.0+unknown"
