"""Fixtures shared by the command tests."""

import pytest
import torch


@pytest.fixture(scope="module", autouse=True)
def _restore_threads():
    """`--threads 1` sets the thread count for the whole process: give it back after a module."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)
