"""What tests on CPU tensors share: whether this machine's Triton interpreter runs them (the GPU machine's
Triton 3.6 does not with its numpy, say), as a skip mark with the reason."""

import pytest

from vflash._backend import interpreter_refusal

needs_interpreter = pytest.mark.skipif(interpreter_refusal() is not None, reason=str(interpreter_refusal()))
