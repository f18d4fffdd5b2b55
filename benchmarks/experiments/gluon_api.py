"""What the machine's Triton offers the sm_90 kernels: Gluon's Hopper modules (TMA copies and
reduce-adds, mbarriers, clusters) and the tensor descriptor's methods in triton.language. The GPU
machine runs an older Triton than CI; a kernel plan that needs a primitive starts by asking here.

  PYTHONPATH=src python3 -m benchmarks.experiments.gluon_api
"""

import inspect

import triton
import triton.language as tl


def public(module) -> list:
    return sorted(n for n in dir(module) if not n.startswith("_"))


def main() -> int:
    print("triton", triton.__version__)
    try:
        from triton.experimental.gluon import language as gl
        from triton.experimental.gluon.language.nvidia import hopper
        from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma
    except ImportError as e:
        print("no Gluon:", e)
        return 0
    print("gluon hopper:", public(hopper))
    print("gluon hopper.tma:", public(tma))
    print("gluon hopper.mbarrier:", public(mbarrier))
    try:
        from triton.experimental.gluon.language.nvidia.hopper import cluster
        print("gluon hopper.cluster:", public(cluster))
    except ImportError as e:
        print("no gluon hopper.cluster:", e)
    print("gluon language (cluster / barrier / program):",
          [n for n in public(gl) if any(w in n.lower() for w in ("cluster", "barrier", "program"))])
    print("gl.warp_specialize", inspect.signature(gl.warp_specialize))
    print("triton.language tensor_descriptor:", public(tl.tensor_descriptor))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
