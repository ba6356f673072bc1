"""An implementation whose import takes CONFORMANCE_TEST_LOAD seconds (a big extension on a busy
machine): the per-case timeout must not count it."""

import os
import time

from v41_conformance.adapters.reference import ReferenceAdapter

time.sleep(float(os.environ.get("CONFORMANCE_TEST_LOAD", "3")))


class SlowToLoad(ReferenceAdapter):
    pass
