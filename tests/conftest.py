"""Test-session settings.

One torch thread: the tests' tensors are small, and on a shared 2-core machine (CI, or
benchmarks running beside the suite) two spinning OpenMP threads per process make small ops
ten times slower without changing any result.
"""

import torch

torch.set_num_threads(1)
