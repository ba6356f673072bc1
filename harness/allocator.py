"""glibc's malloc told to keep a run's freed tensors for the next case instead of handing them back
to the kernel.

A case allocates and frees the same tensors over and over: inputs and their copies, the reference's
outputs, the chain's rederived rows. By default glibc maps every block above its (adaptive, at most
32 MiB) mmap threshold afresh and returns freed memory at the top of the heap above 128 KiB, so each
case faults in, zero-fills and unmaps again what the last one used. On the small tier that is most
of what a run costs beside the reference's own arithmetic (`benchmarks/run_overhead.py`: the runner
pass takes about half the time with these settings). Blocks below `MMAP_THRESHOLD` now come from the
heap and are reused; up to `TRIM_THRESHOLD` of free memory stays mapped at its top. The production
tier's large tensors (above 64 MiB) are still mapped and unmapped on their own.

Only processes that run cases call it: the `conformance` command (its isolation children and fork
server are forks of it) and the fork server the pytest plugin starts; never a process that merely
imports the package. Elsewhere than glibc (musl, macOS, Windows) it does nothing.
"""

from __future__ import annotations

import sys

MMAP_THRESHOLD = 64 << 20
TRIM_THRESHOLD = 256 << 20
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)


def keep_freed_memory() -> bool:
    """Set the thresholds in this process (and the children it forks afterwards); True where glibc
    took them."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # no mallopt (musl): the C library's defaults stand
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
