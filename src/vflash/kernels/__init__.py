"""@triton.jit kernels and their launch configurations only."""
