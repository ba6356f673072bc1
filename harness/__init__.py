"""Golden-data conformance harness for DeepSeek-V4.1 compressed attention."""

__version__ = "0.1.0"

from .adapters.base import Unsupported  # noqa: E402  (raised by implementations for one case)

__all__ = ["Unsupported", "__version__"]
