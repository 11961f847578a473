"""Test-session settings.

One torch thread: the tests' tensors are small, and on a shared 2-core machine (CI, or
benchmarks running beside the suite) two spinning OpenMP threads per process make small ops
ten times slower without changing any result.
"""

from collections.abc import Iterator

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture
def restore_torch_globals() -> Iterator[None]:
    """For tests that run the command in-process: it sets torch's thread count and denormal
    flushing for its process; undo both."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)
    torch.set_flush_denormal(False)
