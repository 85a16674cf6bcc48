"""Errors a user can act on.

Everything convlab raises on bad input is a ConvlabError; the CLI prints its message and exits
non-zero without a traceback. Anything else escaping is a bug in convlab.
"""


class ConvlabError(Exception):
    """A problem with the user's input or environment, explained in the message."""


class DataError(ConvlabError):
    """A data or weights file is missing, truncated or corrupt."""


class DeviceMemoryError(ConvlabError):
    """The GPU ran out of memory for what was asked (a batch too large for it)."""


class GPUUnavailable(ConvlabError):
    """A GPU variant was asked for where CuPy or a usable GPU is missing."""


class UnsupportedLayers(ConvlabError):
    """A variant refuses some of a network's conv layers and nothing stands in for it there;
    `stand_in` names a registered variant of its precision class that runs every one of them,
    where one does (the CLI says how to ask for it)."""

    def __init__(self, message: str, stand_in: str | None = None):
        self.stand_in = stand_in
        super().__init__(message)


class KernelCompileError(ConvlabError):
    """NVRTC rejected a variant's source; the message carries the compiler log."""

    def __init__(self, variant: str, log: str, options=()):
        self.variant = variant
        self.log = log
        self.options = tuple(options)
        super().__init__(
            f"kernel '{variant}' failed to compile (NVRTC options: {' '.join(self.options)})\n{log.strip()}"
        )
