"""User-facing errors: the CLI prints their message as one line and exits non-zero."""


class SieveragError(Exception):
    """An error the user can fix; the message names the input and what to do."""


class DatasetError(SieveragError):
    """A dataset or corpus file is missing, malformed, or holds an unusable record."""


class ConfigError(SieveragError):
    """A configuration value or key is invalid."""


class ModelNotFoundError(SieveragError):
    """A model name is neither an embedded model nor a local model folder."""


class BackendUnavailableError(SieveragError):
    """An LLM server cannot be reached or keeps failing."""
