"""Writing new tokens' keys and values into a paged KV cache (vLLM's
reshape_and_cache_flash): token t goes to slot slot_mapping[t] = block * block_size +
offset of the cache [num_blocks, block_size, Hkv, D]; a slot of -1 (padding) is skipped,
and so is any slot outside the cache, so that an unchecked call never writes out of bounds.
An FP8 cache (QUANTIZE) stores saturate_e4m3(x / descale), as vLLM's FP8 cache write does."""

import triton
import triton.language as tl

from vflash.kernels.tile import to_e4m3


@triton.jit
def write_kvcache_kernel(
    K_CACHE, V_CACHE, K_NEW, V_NEW, SLOTS, K_DESCALE, V_DESCALE, k_cache_strides, v_cache_strides, k_new_strides,
    v_new_strides, descale_strides, block_size, n_slots, n_heads, head_dim,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, QUANTIZE: tl.constexpr, EMULATE: tl.constexpr,
):
    # grid = (tokens, cdiv(n_heads, BLOCK_H)): one token's [BLOCK_H, BLOCK_D] tile of
    # heads x head dim a program, for K and V. Strides: the caches' (page, row, head, dim),
    # the new tokens' (token, head, dim). QUANTIZE: e4m3 caches, each value divided by its head's
    # descale (K_DESCALE / V_DESCALE fp32, None: 1; descale_strides their head strides, 0 for one a cache)
    # and rounded to e4m3 (tile.to_e4m3; EMULATE on its bits, under the interpreter).
    stride_kc_block, stride_kc_pos, stride_kc_h, stride_kc_d = k_cache_strides
    stride_vc_block, stride_vc_pos, stride_vc_h, stride_vc_d = v_cache_strides
    stride_kn_t, stride_kn_h, stride_kn_d = k_new_strides
    stride_vn_t, stride_vn_h, stride_vn_d = v_new_strides
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(SLOTS + t).to(tl.int64)
    if (slot < 0) | (slot >= n_slots):  # padding, or a slot past the cache (check_metadata=False)
        return
    block = slot // block_size
    pos = slot % block_size
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)  # [BLOCK_H]
    dims = tl.arange(0, BLOCK_D)  # [BLOCK_D]
    mask = (heads[:, None] < n_heads) & (dims[None, :] < head_dim)
    k = tl.load(K_NEW + t * stride_kn_t + heads[:, None] * stride_kn_h + dims[None, :] * stride_kn_d, mask=mask)
    v = tl.load(V_NEW + t * stride_vn_t + heads[:, None] * stride_vn_h + dims[None, :] * stride_vn_d, mask=mask)
    if QUANTIZE:
        kd_h, vd_h = descale_strides
        k = k.to(tl.float32)
        v = v.to(tl.float32)
        if K_DESCALE is not None:
            k = k / tl.load(K_DESCALE + heads * kd_h, mask=heads < n_heads, other=1.0)[:, None]
        if V_DESCALE is not None:
            v = v / tl.load(V_DESCALE + heads * vd_h, mask=heads < n_heads, other=1.0)[:, None]
        k = to_e4m3(k, EMULATE)
        v = to_e4m3(v, EMULATE)
    tl.store(K_CACHE + block * stride_kc_block + pos * stride_kc_pos + heads[:, None] * stride_kc_h
             + dims[None, :] * stride_kc_d, k, mask=mask)
    tl.store(V_CACHE + block * stride_vc_block + pos * stride_vc_pos + heads[:, None] * stride_vc_h
             + dims[None, :] * stride_vc_d, v, mask=mask)
