"""Golden-data conformance harness for DeepSeek-V4.1 compressed attention."""

__version__ = "0.1.0"
