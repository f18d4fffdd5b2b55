"""@triton.jit / @gluon.jit code only: the kernels and their shared jit helpers."""
