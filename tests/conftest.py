import atexit
import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(skip)


def pytest_unconfigure(config):
    # Compiling a Gluon kernel for sm_90 on the CPU (the compile tests) leaves Triton's nanobind bindings
    # objects they report as leaked when the interpreter exits, a dump after pytest's summary that reads
    # like a failure. Triton silences the same report in its own compile workers (its
    # _compile_warmup_pool); so do the tests: stderr goes to /dev/null at exit, after the summary.
    atexit.register(_silence_stderr)


def _silence_stderr():
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    os.close(devnull)


@pytest.fixture
def device():
    """CPU (through the Triton interpreter) unless VFLASH_TEST_DEVICE says otherwise."""
    return torch.device(os.environ.get("VFLASH_TEST_DEVICE", "cpu"))


@pytest.fixture
def interpreted_plans(monkeypatch):
    # launch plans for CPU tensors, their launches through Triton's interpreter: the plan path (key,
    # lookup, slots rebuilt per call, split scratch fetched per call) on the CPU, which plans otherwise
    # leave to the full path
    from vflash import _backend
    from vflash.ops import launch as launches
    from vflash.ops import plans

    refusal = _backend.interpreter_refusal()
    if refusal is not None:  # the GPU machine's Triton and numpy, say: its GPU tests cover the plans there
        pytest.skip(f"CPU tensors do not run here: {refusal}")
    real_run = launches.run

    class Interpreted:
        def __init__(self, launch, device):
            self.launch, self.device = launch, device

        def __getitem__(self, grid):
            names = self.launch.kernel.arg_names
            return lambda *params: _backend.launcher(self.launch.kernel, self.device)[grid](
                **dict(zip(names, params)))

    def run(launch, device):
        real_run(launch, device)
        return Interpreted(launch, device)
    monkeypatch.setattr(launches, "run", run)
    monkeypatch.setattr(plans, "_planned", lambda q: True)
    monkeypatch.setattr(plans, "_current_device", lambda: None)  # a CPU tensor's device index
    monkeypatch.setattr(torch.cuda, "current_device", lambda: None)
    plans.clear()
    yield plans
    plans.clear()
