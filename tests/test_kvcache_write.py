"""vflash.write_kvcache: new tokens' K/V land in their paged-cache slots, in place, and
nothing else changes (against reference/paged.py); -1 slots skipped; any block size and
strides; bad metadata refused before the launch."""

import pytest
import torch

import vflash
from vflash import dispatch
from vflash.ops.cache import write_kvcache_forward
from vflash.reference import write_kvcache_reference


def _setup(num_blocks, block_size, h, d, tokens, device, dtype=torch.float16, seed=0, pad_every=0):
    g = torch.Generator().manual_seed(seed)
    k_cache, v_cache = (torch.randn(num_blocks, block_size, h, d, generator=g).to(dtype).to(device) for _ in range(2))
    k_new, v_new = (torch.randn(tokens, h, d, generator=g).to(dtype).to(device) for _ in range(2))
    slots = torch.randperm(num_blocks * block_size, generator=g)[:tokens]  # shuffled, distinct
    if pad_every:
        slots[::pad_every] = -1
    return k_cache, v_cache, k_new, v_new, slots.to(device)


@pytest.mark.parametrize("block_size", [1, 16, 17])
@pytest.mark.parametrize("slot_dtype", [torch.int32, torch.int64])
def test_tokens_land_in_their_slots(block_size, slot_dtype, device):
    k_cache, v_cache, k_new, v_new, slots = _setup(6, block_size, 3, 24, 5, device, pad_every=3)
    slots = slots.to(slot_dtype)
    ref_k, ref_v = write_kvcache_reference(k_cache, v_cache, k_new, v_new, slots)
    k_ptr = k_cache.data_ptr()
    vflash.write_kvcache(k_cache, v_cache, k_new, v_new, slots)
    assert k_cache.data_ptr() == k_ptr  # in place
    assert torch.equal(k_cache, ref_k) and torch.equal(v_cache, ref_v)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_dtypes_and_many_heads(dtype, device):
    k_cache, v_cache, k_new, v_new, slots = _setup(4, 16, 11, 64, 9, device, dtype=dtype)  # 11 heads: 2 programs
    ref_k, ref_v = write_kvcache_reference(k_cache, v_cache, k_new, v_new, slots)
    vflash.write_kvcache(k_cache, v_cache, k_new, v_new, slots)
    assert torch.equal(k_cache, ref_k) and torch.equal(v_cache, ref_v)


def test_strided_cache_and_inputs(device):
    # a cache whose heads and positions are swapped in memory, and new K/V as views of one buffer
    g = torch.Generator().manual_seed(3)
    k_cache = torch.randn(4, 2, 8, 16, generator=g).half().to(device).transpose(1, 2)  # [4, 8, 2, 16] view
    v_cache = torch.randn(4, 8, 2, 16, generator=g).half().to(device)
    kv = torch.randn(5, 2, 2, 16, generator=g).half().to(device)
    slots = torch.tensor([31, 0, -1, 9, 16], device=device)
    ref_k, ref_v = write_kvcache_reference(k_cache, v_cache, kv[:, 0], kv[:, 1], slots)
    vflash.write_kvcache(k_cache, v_cache, kv[:, 0], kv[:, 1], slots)
    assert torch.equal(k_cache, ref_k) and torch.equal(v_cache, ref_v)


def test_contiguous_cache_is_one_block_per_sequence(device):
    # [B, max_len, Hkv, D] is block_size = max_len: slot = b * max_len + position
    cache_k, cache_v = torch.zeros(3, 10, 2, 8, device=device), torch.zeros(3, 10, 2, 8, device=device)
    new = torch.arange(3 * 2 * 8, dtype=torch.float32, device=device).view(3, 2, 8) + 1
    positions = [4, 0, 9]  # the next position of each sequence
    slots = torch.tensor([b * 10 + p for b, p in enumerate(positions)], device=device)
    vflash.write_kvcache(cache_k, cache_v, new, -new, slots)
    for b, p in enumerate(positions):
        assert torch.equal(cache_k[b, p], new[b]) and torch.equal(cache_v[b, p], -new[b])
    assert int((cache_k != 0).any(-1).any(-1).sum()) == 3


def test_no_tokens_and_all_padding(device):
    k_cache, v_cache, k_new, v_new, slots = _setup(2, 4, 1, 16, 3, device)
    before = k_cache.clone()
    vflash.write_kvcache(k_cache, v_cache, k_new, v_new, torch.full((3,), -1, device=device))
    vflash.write_kvcache(k_cache, v_cache, k_new[:0], v_new[:0], slots[:0])
    assert torch.equal(k_cache, before)


@pytest.mark.parametrize("change,error,match", [
    (lambda kc, vc, kn, vn, s: dict(slot_mapping=s.float()), TypeError, "int32 or int64"),
    (lambda kc, vc, kn, vn, s: dict(slot_mapping=s[:2]), ValueError, "2 entries for 3 tokens"),
    (lambda kc, vc, kn, vn, s: dict(slot_mapping=torch.tensor([0, 32, 1], device=s.device)), ValueError,
     r"slot_mapping\[1\] = 32 is outside the cache's 32 slots \(8 blocks of 4\)"),
    (lambda kc, vc, kn, vn, s: dict(slot_mapping=torch.tensor([5, -2, 1], device=s.device)), ValueError,
     r"slot_mapping\[1\] = -2 is outside"),
    (lambda kc, vc, kn, vn, s: dict(slot_mapping=torch.tensor([5, 1, 5], device=s.device)), ValueError,
     r"slot_mapping\[2\] = 5 repeats slot_mapping\[0\]"),
    (lambda kc, vc, kn, vn, s: dict(k_new=kn.float(), v_new=vn.float()), TypeError, "share one of"),
    (lambda kc, vc, kn, vn, s: dict(v_cache=vc[:4]), ValueError, "must both be"),
    (lambda kc, vc, kn, vn, s: dict(k_new=kn[:, :, :8], v_new=vn[:, :, :8]), ValueError, "heads and head dim"),
    (lambda kc, vc, kn, vn, s: dict(k_new=kn.tolist()), TypeError, "k_new must be a torch.Tensor, got list"),
    (lambda kc, vc, kn, vn, s: dict(check_metadata="yes"), TypeError, "check_metadata"),
    (lambda kc, vc, kn, vn, s: dict(slot_mapping=s.to("meta")), ValueError, "must be on one device"),
    (lambda kc, vc, kn, vn, s: dict(slot_mapping=torch.tensor([0, 1, 2, 3, 4, 5], device=s.device)[::2]),
     ValueError, "slot_mapping must be contiguous"),
])
def test_bad_metadata_is_refused_before_launch(change, error, match, device):
    kc, vc, kn, vn, s = _setup(8, 4, 2, 16, 3, device)
    before = kc.clone()
    args = dict(k_cache=kc, v_cache=vc, k_new=kn, v_new=vn, slot_mapping=s)
    args.update(change(kc, vc, kn, vn, s))
    with pytest.raises(error, match=match):
        vflash.write_kvcache(**args)
    assert torch.equal(kc, before)  # nothing written


# the check on the host, and on the device past 1024 slots
@pytest.mark.parametrize("tokens", [300, pytest.param(1500, marks=pytest.mark.slow)])
def test_many_slots_are_checked(tokens, device):
    # every third token padding (-1 repeats freely): the check passes them, then names the one token that
    # repeats a slot and the one past the cache
    kc, vc, kn, vn, slots = _setup(128, 16, 1, 16, tokens, device, pad_every=3)
    slots = slots.cpu()
    vflash.write_kvcache(kc, vc, kn, vn, slots.to(device))
    kept = slots >= 0
    assert torch.equal(kc.view(-1, 1, 16)[slots[kept].to(device)], kn[kept.to(device)])
    last = tokens - 1
    dup = slots.clone()
    dup[last] = dup[1]
    with pytest.raises(ValueError, match=rf"slot_mapping\[{last}\] = {int(dup[1])} repeats slot_mapping\[1\]"):
        vflash.write_kvcache(kc, vc, kn, vn, dup.to(device))
    far = slots.clone()
    far[last - 1] = 2048
    with pytest.raises(ValueError, match=rf"slot_mapping\[{last - 1}\] = 2048 is outside"):
        vflash.write_kvcache(kc, vc, kn, vn, far.to(device))
    low = slots.clone()
    low[last] = -3
    with pytest.raises(ValueError, match=rf"slot_mapping\[{last}\] = -3 is outside"):
        vflash.write_kvcache(kc, vc, kn, vn, low.to(device))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="plans record compiled GPU launches")
def test_gpu_unchecked_repeats_launch_a_recorded_plan():
    # check_metadata=False records the launch at the first call of a metadata key; a repeat with other
    # tensors of that metadata runs the plan and writes its own tokens into its own cache
    from vflash.ops import plans
    plans.clear()
    dev = torch.device("cuda")
    for seed in (0, 1, 2):
        kc, vc, kn, vn, slots = _setup(16, 16, 8, 128, 40, dev, dtype=torch.bfloat16, seed=seed, pad_every=5)
        want_k, want_v = write_kvcache_reference(kc, vc, kn, vn, slots)
        vflash.write_kvcache(kc, vc, kn, vn, slots.to(torch.int32), check_metadata=False)
        assert torch.equal(kc, want_k) and torch.equal(vc, want_v)
        assert len(plans._plans) == 1  # one key for the three calls
    vflash.write_kvcache(kc, vc, kn, vn, slots, check_metadata=False)  # int64 slots: a key of their own
    vflash.write_kvcache(kc, vc, kn, vn, slots.to(torch.int32))  # checked: a key of its own
    assert len(plans._plans) == 3


def test_checked_repeats_take_the_plan_after_the_slots_check(interpreted_plans):
    # a checked call records its plan; a repeat checks its own slots before it: good slots written as the
    # reference writes them, a duplicate or out-of-range slot refused with the cache untouched
    kc, vc, kn, vn, slots = _setup(8, 4, 2, 16, 12, "cpu", pad_every=5)
    want_k, want_v = write_kvcache_reference(kc, vc, kn, vn, slots)
    vflash.write_kvcache(kc.clone(), vc.clone(), kn, vn, slots)
    assert [key[0] for key in interpreted_plans._plans] == ["write_kvcache"]
    vflash.write_kvcache(kc, vc, kn, vn, slots)
    assert torch.equal(kc, want_k) and torch.equal(vc, want_v) and len(interpreted_plans._plans) == 1
    for bad, match in ((32, "is outside"), (int(slots[1]), "repeats slot_mapping")):
        wrong = slots.clone()
        wrong[0] = bad
        before = kc.clone()
        with pytest.raises(ValueError, match=match):
            vflash.write_kvcache(kc, vc, kn, vn, wrong)
        assert torch.equal(kc, before)


def test_unchecked_slots_outside_the_cache_are_skipped(device):
    # check_metadata=False trusts the slots, but the kernel skips a slot past the cache (or below -1) like
    # padding, never writing out of bounds: only the good tokens land, and the cache is otherwise unchanged.
    # CPU tensors are checked whatever the flag (the interpreter has no memory protection to fall back on):
    # there the call refuses the slots, and the kernel's own bound is run through its launcher.
    kc, vc, kn, vn, _ = _setup(4, 4, 2, 16, 5, device)
    slots = torch.tensor([3, 16, 1 << 20, -7, 9], device=device)
    want_k, want_v = write_kvcache_reference(kc, vc, kn[[0, 4]], vn[[0, 4]], slots[[0, 4]])
    if device.type == "cpu":
        with pytest.raises(ValueError, match=r"slot_mapping\[1\] = 16 is outside"):
            vflash.write_kvcache(kc, vc, kn, vn, slots, check_metadata=False)
        write_kvcache_forward(kc, vc, kn, vn, slots, tiles=dispatch.cache_write_tiles())
    else:
        vflash.write_kvcache(kc, vc, kn, vn, slots, check_metadata=False)
    assert torch.equal(kc, want_k) and torch.equal(vc, want_v)
