import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    """The audit's tensors have a handful of entries: threads only add overhead."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
