"""Python's cyclic garbage collector set for a process that judges cases, once start-up is over.

A process that has imported torch, the harness and an implementation tracks some 180,000 container
objects that live as long as it does. By default every full collection walks all of them again
(about 130 ms here, every few hundred cases of the small tier), and a young collection runs each
time 700 more containers have been made than freed, while one attention case builds thousands of
result records that live until it ends. `settle()` freezes what start-up built out of every later
collection (`gc.freeze`) and lets young collections wait for `YOUNG_COLLECTION` new containers;
cycles a case leaves behind are still collected. Measured by `benchmarks/run_overhead.py`
(`--gc-defaults` to compare: the small tier's runner about 3.6x reading its goldens without it,
2.5-2.9x with it).

Only a process that exists to judge cases calls it, once its implementation is loaded: an isolation
child (`v41_conformance.isolation`), never a host that merely imports the package (its objects
frozen for good would never be collected if they died in a cycle).
"""

from __future__ import annotations

import gc

YOUNG_COLLECTION = 10_000  # new container objects between young collections (Python's default: 700)


def settle() -> None:
    """Freeze the objects alive now out of the collector's reach and space young collections out."""
    gc.freeze()
    young, middle, old = gc.get_threshold()
    gc.set_threshold(max(young, YOUNG_COLLECTION), middle, old)
