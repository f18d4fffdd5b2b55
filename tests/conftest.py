import pytest
import torch

HAS_CUDA = torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(skip)


@pytest.fixture
def device():
    """CPU (through the Triton interpreter) unless VFLASH_TEST_DEVICE says otherwise."""
    import os
    return torch.device(os.environ.get("VFLASH_TEST_DEVICE", "cpu"))
