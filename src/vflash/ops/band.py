"""The mask band every attention kernel takes: query row i sees key j when

    i + off - left <= j <= i + off + right        (left/right < 0: unbounded)

`mask_band` folds a dense call's band on the host from its lengths. A packed
(varlen) call has one length pair per sequence: `sequence_band` gives its edges,
and the kernel takes each sequence's offset from its own lengths
(`kernels/seqlen.py`)."""

from typing import NamedTuple, Optional, Tuple


class Band(NamedTuple):
    off: int  # the diagonal's key offset: Nk - Nq (bottom-right) or 0 (top-left)
    left: int  # keys a row sees left of its diagonal; < 0: unbounded
    right: int  # keys a row sees right of its diagonal; < 0: unbounded (0: causal)

    @property
    def has_left(self) -> bool:
        """Some row has keys hidden on its left (a sliding window's far edge)."""
        return self.left >= 0

    @property
    def has_right(self) -> bool:
        """Some row has keys hidden on its right (a causal diagonal or a window's near edge).
        Such rows differ in cost, which the kernels' schedules care about."""
        return self.right >= 0


def mask_band(n_q: int, n_k: int, causal: Optional[str], window: Tuple[int, int]) -> Band:
    """Fold causal mode ("top_left", "bottom_right" or None), window and
    Nq != Nk into a Band.

    off = Nk - Nq (bottom-right alignment) unless the causal mode is "top_left".
    Causal attention caps right at 0. A side that hides no key from any row
    becomes unbounded, so the kernel neither masks nor bounds-checks for it (one
    decode query at the end of its keys is causal in name only)."""
    off = 0 if causal == "top_left" else n_k - n_q
    left, right = window
    if causal is not None:
        right = 0 if right < 0 else min(right, 0)
    if left >= n_q - 1 + off:  # row Nq-1, the one with the highest lower bound, still starts at key <= 0
        left = -1
    if right >= n_k - 1 - off:  # row 0, the one with the lowest upper bound, already ends at key >= Nk-1
        right = -1
    return Band(off, left, right)


def sequence_band(causal: Optional[str], window: Tuple[int, int]) -> Band:
    """The edges of a band whose offset each sequence takes from its own lengths
    (Nk - Nq, or 0 under "top_left"): off is 0 here and unused. Causal caps
    right at 0. No edge is folded away: whether it hides a key depends on the
    sequence."""
    left, right = window
    if causal is not None:
        right = 0 if right < 0 else min(right, 0)
    return Band(0, left, right)
