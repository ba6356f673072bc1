"""Golden-data conformance harness for DeepSeek-V4.1 compressed attention."""

__version__ = "0.1.0"

__all__ = ["Declined", "Unsupported", "__version__"]


def __getattr__(name: str):
    # Imported on first use, so `import v41_conformance` (the CLI) does not import torch before it must.
    if name == "Unsupported":  # raised by implementations for one case they decline
        from .adapters.base import Unsupported

        return Unsupported
    if name == "Declined":  # returned by implementations for one output they decline
        from .adapters.base import Declined

        return Declined
    raise AttributeError(f"module 'v41_conformance' has no attribute {name!r}")
