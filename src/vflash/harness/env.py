"""The environment record kept with every check log and benchmark CSV."""

import datetime
import os
import platform
import subprocess
from typing import Dict, Optional

import torch


def _driver() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.strip().splitlines()
        return out[0] if out else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _commit() -> str:
    """The checkout's git commit (with "+dirty" for uncommitted changes), if any;
    VFLASH_COMMIT overrides it for copies of a tree made without .git."""
    if os.environ.get("VFLASH_COMMIT"):
        return os.environ["VFLASH_COMMIT"]
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True, text=True,
                             timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return (sha + ("+dirty" if dirty else "")) if sha else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def environment(device: Optional[torch.device] = None) -> Dict[str, object]:
    """Versions, device, compute capability, driver, and whether the interpreter is on.

    `device` defaults to CUDA when present, else the CPU.
    """
    import triton

    import vflash
    from vflash._backend import interpreted
    from vflash.kernels.attention_fwd_sm90 import HAVE_GLUON

    if device is None:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    env: Dict[str, object] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "vflash": vflash.__version__, "python": platform.python_version(), "torch": torch.__version__,
        "triton": triton.__version__, "cuda_available": torch.cuda.is_available(),
        "triton_interpreter": interpreted(device), "device": device.type, "commit": _commit(),
        "gluon": HAVE_GLUON,
    }
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        env.update(gpu=p.name, compute_capability=f"{p.major}.{p.minor}", sm_count=p.multi_processor_count,
                   driver=_driver(), cuda=str(torch.version.cuda))
    else:
        env.update(gpu="none (CPU, Triton interpreter)",
                   cpu=platform.processor() or platform.machine())
    return env
