"""Whether this process has initialised the CUDA driver, asked of libcuda without initialising it.

A process forked from one that has initialised the driver (`cuInit`) cannot use CUDA: its first
call fails with CUDA_ERROR_NOT_INITIALIZED ("CUDA error: initialization error"). torch's own flag
(`torch.cuda.is_initialized()`) misses a driver that `torch.cuda.is_available()`, another library,
a team's conftest or the user initialised, so the driver itself is asked: `cuDeviceGetCount`
answers CUDA_ERROR_NOT_INITIALIZED until `cuInit` has run in this process. The driver is never
loaded for the question (`RTLD_NOLOAD`): where no libcuda is loaded it cannot be initialised, so on
a machine without one the answer costs one failed lookup among the loaded libraries.
"""

from __future__ import annotations

import ctypes
import os

NOT_INITIALIZED = 3  # CUDA_ERROR_NOT_INITIALIZED
LIBRARY = "libcuda.so.1"
TEST_LIBRARY = "CONFORMANCE_TEST_LIBCUDA"  # tests only: the path of a stand-in driver to ask instead


def library_name() -> str:
    return os.environ.get(TEST_LIBRARY) or LIBRARY


def loaded():
    """The driver library if this process has already loaded it, else None (it is never loaded here)."""
    mode = getattr(os, "RTLD_NOLOAD", None)
    if mode is None:  # no such flag (not Linux, not macOS): no CUDA driver to ask either
        return None
    try:
        return ctypes.CDLL(library_name(), mode=mode | getattr(os, "RTLD_LAZY", 1))
    except OSError:
        return None


def initialised() -> bool:
    """Whether `cuInit` has run in this process (any answer but NOT_INITIALIZED counts as yes)."""
    driver = loaded()
    if driver is None:
        return False
    try:
        count_devices = driver.cuDeviceGetCount
    except AttributeError:  # a library of that name that is not a CUDA driver
        return False
    count = ctypes.c_int(0)
    return count_devices(ctypes.byref(count)) != NOT_INITIALIZED


def device_count() -> int | None:
    """Initialise the driver in this process and count its devices: None without a driver, 0 when
    it fails. Only for a throwaway child (`v41_conformance.device_check`): it poisons later forks."""
    try:
        driver = ctypes.CDLL(library_name())
    except OSError:
        return None
    count = ctypes.c_int(0)
    try:
        if driver.cuInit(0) != 0 or driver.cuDeviceGetCount(ctypes.byref(count)) != 0:
            return 0
    except AttributeError:
        return None
    return count.value


def driver_version() -> str | None:
    """The driver's CUDA version ("12.4"), asked of an already loaded driver (None otherwise)."""
    driver = loaded()
    version = ctypes.c_int(0)
    try:
        if driver is None or driver.cuDriverGetVersion(ctypes.byref(version)) != 0:
            return None
    except AttributeError:
        return None
    return f"{version.value // 1000}.{version.value % 1000 // 10}"
