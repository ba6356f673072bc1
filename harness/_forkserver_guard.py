"""Imported by the fork server alone (first in its preload list, `v41_conformance.forkserver`): the server
dies with the process that started it, even when that process is killed with SIGKILL (Linux
`PR_SET_PDEATHSIG`), and its children die with it the same way (`v41_conformance.isolation`). Without
this, a fork server outlives a killed run and keeps a hung child alive. It also keeps freed
tensors in the server's heap for its children (`v41_conformance.allocator`). Never import it
elsewhere: it would tie the importing process's life to its parent's."""

import os
import signal

from .allocator import keep_freed_memory

keep_freed_memory()

try:
    import ctypes

    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
except (OSError, AttributeError):  # not Linux: the server exits when its parent closes its pipe
    pass
else:
    if os.getppid() == 1:  # the parent died before the signal was armed
        os._exit(0)
