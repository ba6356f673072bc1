"""Golden-data conformance harness for DeepSeek-V4.1 compressed attention."""

from typing import TYPE_CHECKING

__version__ = "0.1.0"

__all__ = ["Declined", "Unsupported", "__version__"]

if TYPE_CHECKING:  # what the __getattr__ below gives, for type checkers (nothing is imported at run time)
    from .adapters.base import Declined, Unsupported


if not TYPE_CHECKING:  # hidden from type checkers, which then flag a name the package does not have

    def __getattr__(name: str) -> object:
        # Imported on first use, so `import v41_conformance` (the CLI) does not import torch before it must.
        if name == "Unsupported":  # raised by implementations for one case they decline
            from .adapters.base import Unsupported

            return Unsupported
        if name == "Declined":  # returned by implementations for one output they decline
            from .adapters.base import Declined

            return Declined
        raise AttributeError(f"module 'v41_conformance' has no attribute {name!r}")
