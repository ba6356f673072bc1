"""Every component's case space (harness/space.py), one module per group of components.

Importing this package registers them all; `spaces()` returns them. Each draw returns (params,
build) as a case file would write them; `tests/test_spaces.py` checks that every component has a space and that draws
build and pass with the reference.
"""

from __future__ import annotations

from ..space import SPACES, Space
from . import attention_path, indexing, numerics  # noqa: F401  (each registers its spaces)


def spaces() -> dict[str, Space]:
    """Every registered space (their definitions were imported with this package)."""
    return SPACES
