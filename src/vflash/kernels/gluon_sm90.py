"""The Gluon names the sm_90 kernels (attention_fwd_hopper.py, attention_bwd_hopper.py) use,
the same across the Triton releases vflash runs on. HAVE_GLUON is False on a Triton without
Gluon, where the portable kernels serve everything and nothing else here exists."""

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.language.core import _aggregate as aggregate
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )

    # Triton 3.6 (the GPU machine) names the TMA copies async_copy_*; later
    # releases renamed them async_load / async_store. Either serves.
    tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
    tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global
    HAVE_GLUON = True
except (ImportError, AttributeError):
    HAVE_GLUON = False

__all__ = ["HAVE_GLUON", "gluon", "gl", "aggregate", "fence_async_shared", "mbarrier", "tma", "warpgroup_mma",
           "warpgroup_mma_wait", "tma_load", "tma_store"]
