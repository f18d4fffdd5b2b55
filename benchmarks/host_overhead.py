"""Host-side cost of one vflash.attention call on a tiny shape (launch overhead and
Python work), with a CPU timer around many calls; SDPA flash alongside. GPU only."""

import time

import torch

import vflash


def per_call_us(fn, n=2000):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()  # host time to issue n calls; the GPU queue absorbs them
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e6


q = torch.randn(1, 2, 16, 64, device="cuda", dtype=torch.float16)
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

for name, fn in (("vflash", lambda: vflash.attention(q, q, q)),
                 ("vflash causal+lse", lambda: vflash.attention(q, q, q, causal=True, return_lse=True)),
                 ("sdpa (default)", lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q))):
    print(f"{name:>20}: {per_call_us(fn):6.1f} us per call (host)")
with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
    print(f"{'sdpa_flash':>20}: {per_call_us(lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q)):6.1f} us per call (host)")
