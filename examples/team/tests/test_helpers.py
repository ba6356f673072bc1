"""Our own tests of our own helpers: `import harness` is ours, whatever else is installed."""

import numpy as np
from harness import bench

from mykernels import e2m1


def test_bench_returns_what_the_kernel_returns():
    codes, values = bench(e2m1, np.array([0.25, -1.75, 7.0], dtype=np.float32))
    assert values.tolist() == [0.0, -2.0, 6.0] and codes.tolist() == [0, 12, 7]
