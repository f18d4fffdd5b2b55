"""What the sm_90 GPU tests share: whether this machine runs the Gluon kernel, and the tiles
each of them covers beyond the dispatch table's own."""

import pytest
import torch

from vflash.dispatch import tables
from vflash.kernels.attention_fwd_sm90 import HAVE_GLUON


def on_sm90() -> bool:
    return torch.cuda.is_available() and HAVE_GLUON and torch.cuda.get_device_capability() == (9, 0)


needs_sm90 = pytest.mark.skipif(not on_sm90(), reason="needs an sm_90 GPU and Gluon")


def tile_variants(d: int, has_right: bool) -> set:
    """SM90's tiles for (d, has_right) with and without DYNAMIC and at each Q buffer count up to the
    table's, plus the short-row bands' and few-tile tables' tiles of that head dim (one consumer, two or
    three CTAs an SM)."""
    base = tables.SM90[(d, has_right)]
    extra = {b.tiles for b in tables.SM90_SHORT_CAUSAL.get(d, ())} | {
        t for (dim, _), t in tables.SM90_FEW_TILES.items() if dim == d}
    return {base._replace(dynamic=dyn, q_buffers=qb) for dyn in (False, True)
            for qb in range(1, base.q_buffers + 1)} | extra
