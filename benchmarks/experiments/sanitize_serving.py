"""Every serving kernel launched once on edge-case metadata, for compute-sanitizer (issue 22:
no launch reads out of bounds). Each call is also checked against the reference, so a run
without the sanitizer is a correctness smoke test too.

Covered: attention_varlen on both kernels (zero-length sequences, a slab crossing each
sequence's end, the last sequence at the packed tensors' end), attention_with_kvcache
decode (pages of 1, 16, 17, 64, 256 and a contiguous cache; split-KV, also into a strided out=;
batch-invariant) and chunked prefill (pages of 16 and
64 and a contiguous cache on the sm90 kernel, pages of 16 and 32 also in order (a tile's pages in one
copy), pages of 17 on the portable one; cache rows past
each length and spare pages NaN, the block table's unused entries out of range), write_kvcache
with padding slots and (unchecked) slots past the cache, merge_states with -inf rows.

  compute-sanitizer --tool memcheck --error-exitcode 1 python3 -m benchmarks.experiments.sanitize_serving
  PYTHONPATH=src python3 -m benchmarks.experiments.sanitize_serving --device cpu   # a smoke run, interpreter
"""

import argparse

import torch

import vflash
from vflash.harness.oracle import compare
from vflash.reference import attention_varlen_reference, attention_with_kvcache_reference


def _cu(lengths, device):
    return torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32, device=device)


def _check(name, out, ref, same, dtype):
    verdict = compare(name, out.cpu(), ref.cpu(), same.cpu(), dtype)
    print(f"{name}: max err {verdict.max_err:.2e} (tol {verdict.tol:.2e}) {'ok' if verdict.passed else 'WRONG'}",
          flush=True)
    return verdict.passed


def _paged_cache(lens, page, hkv, d, dtype, device, seed, in_order=False):
    # shuffled pages (in_order: each sequence's pages one after another), a spare page, NaN past each
    # length and in the spare page, unused table entries far out of range (the kernels must not read them)
    g = torch.Generator().manual_seed(seed)
    need = [max(1, -(-n // page)) for n in lens]
    n_pages = sum(need) + 1
    order = list(range(n_pages)) if in_order else torch.randperm(n_pages, generator=g).tolist()
    table = torch.full((len(lens), max(need) + 2), 1 << 30, dtype=torch.int32)
    caches = [torch.randn(n_pages, page, hkv, d, generator=g).to(dtype) for _ in range(2)]
    used = 0
    for b, n in enumerate(need):
        for j in range(n):
            table[b, j] = order[used]
            used += 1
        last = int(table[b, n - 1])
        for c in caches:
            c[last, lens[b] - (n - 1) * page:] = float("nan")
    for c in caches:
        c[order[-1]] = float("nan")
    return caches[0].to(device), caches[1].to(device), table.to(device)


def varlen(device, dtype, d):
    lens = [1, 0, 200, 64, 129, 1100, 63] if device.type == "cuda" else [1, 0, 20, 33]
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(sum(lens), h, d, generator=g).to(dtype).to(device) for h in (8, 2, 2))
    cu = _cu(lens, device)
    ok = True
    for causal in (False, True):
        out = vflash.attention_varlen(q, k, v, cu, cu, max(lens), max(lens), causal=causal)
        ref, _ = attention_varlen_reference(q, k, v, cu, cu, causal=causal, compute_dtype=torch.float64)
        same, _ = attention_varlen_reference(q, k, v, cu, cu, causal=causal, compute_dtype=None)
        ok &= _check(f"varlen causal={causal}", out, ref, same, dtype)
    return ok


def kvcache(device, dtype, d, in_order_only=False):
    ok = True
    cuda = device.type == "cuda"
    lens_k = [1000, 77, 129, 3] if cuda else [40, 7, 17, 3]
    chunk = 300 if cuda else 12
    cases = ((1, 1, {}), (16, 1, dict(num_splits=3)), (17, 1, dict(batch_invariant=True)),
             (16, 2, dict(num_splits=5, out="strided")), (0, 1, dict(num_splits=4)),
             (64, 1, dict(num_splits=2)), (256, 1, {}),
             (16, chunk, {}), (64, chunk, {}), (17, chunk, {}), (0, chunk, {}),
             (16, chunk, dict(in_order=True)), (32, chunk, dict(in_order=True)))
    for page, n_q, opts in cases:
        opts = dict(opts)
        in_order = opts.pop("in_order", False)
        if in_order_only and not in_order:
            continue
        if page:
            k_cache, v_cache, table = _paged_cache(lens_k, page, 2, d, dtype, device, seed=page, in_order=in_order)
        else:  # contiguous, NaN past each length
            k_cache, v_cache = (torch.randn(4, max(lens_k) + 5, 2, d).to(dtype).to(device) for _ in range(2))
            for b, n in enumerate(lens_k):
                k_cache[b, n:] = float("nan")
                v_cache[b, n:] = float("nan")
            table = None
        q = torch.randn(4, n_q, 8, d).to(dtype).to(device)
        seqlens = torch.tensor(lens_k, dtype=torch.int32, device=device)
        if opts.get("out") == "strided":  # out=: a view of a larger buffer, every row's heads apart
            opts = dict(opts, out=torch.empty(4, n_q, 8, d + 24, dtype=dtype, device=device)[..., 8:8 + d])
        out = vflash.attention_with_kvcache(q, k_cache, v_cache, seqlens, block_table=table, **opts)
        ref_table = table if table is not None else torch.arange(4, dtype=torch.int32, device=device)[:, None]
        cu = torch.arange(5, dtype=torch.int32, device=device) * n_q
        qp = q.reshape(-1, 8, d)
        ref, _ = attention_with_kvcache_reference(qp, k_cache, v_cache, seqlens, ref_table, cu,
                                                  compute_dtype=torch.float64)
        same, _ = attention_with_kvcache_reference(qp, k_cache, v_cache, seqlens, ref_table, cu, compute_dtype=None)
        name = {k: "strided" if k == "out" else v for k, v in opts.items()}
        name.update(dict(in_order=True) if in_order else {})
        ok &= _check(f"kvcache page={page} n_q={n_q} {name}", out.reshape(-1, 8, d), ref, same, dtype)
    return ok


def write_and_merge(device, dtype, d):
    k_cache, v_cache = (torch.zeros(6, 16, 2, d, dtype=dtype, device=device) for _ in range(2))
    k_new, v_new = (torch.randn(5, 2, d).to(dtype).to(device) for _ in range(2))
    slots = torch.tensor([0, -1, 17, 95, -1], dtype=torch.int32, device=device)
    vflash.write_kvcache(k_cache, v_cache, k_new, v_new, slots)
    ok = torch.equal(k_cache.view(-1, 2, d)[95], k_new[3]) and torch.equal(v_cache.view(-1, 2, d)[17], v_new[2])
    # Unchecked slots past the cache (96 slots here) are skipped by the kernel, never written out of bounds.
    before = k_cache.clone(), v_cache.clone()
    wild = torch.tensor([96, 2**30, 5, 2**31 - 1, -1], dtype=torch.int32, device=device)
    vflash.write_kvcache(k_cache, v_cache, k_new, v_new, wild, check_metadata=False)
    for cache, old, new in ((k_cache, before[0], k_new), (v_cache, before[1], v_new)):
        old.view(-1, 2, d)[5] = new[2]
        ok &= torch.equal(cache, old)
    out_a, out_b = (torch.randn(2, 4, 33, d, device=device) for _ in range(2))
    lse_a, lse_b = (torch.randn(2, 4, 33, device=device) for _ in range(2))
    lse_a[0, 0, :5] = float("-inf")
    lse_b[0, 0, :3] = float("-inf")
    out, lse = vflash.merge_states(out_a, lse_a, out_b, lse_b)
    ok &= bool(torch.isfinite(out).all()) and bool(torch.isneginf(lse[0, 0, :3]).all())
    print(f"write_kvcache / merge_states: {'ok' if ok else 'WRONG'}", flush=True)
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--in-order-only", action="store_true",
                    help="only chunked prefill on caches whose pages are in order (a tile's pages in one copy)")
    args = ap.parse_args()
    device = torch.device(args.device)
    dtype, dims = (torch.bfloat16, (64, 128)) if device.type == "cuda" else (torch.float32, (16,))
    ok = True
    for d in dims:
        if args.in_order_only:
            ok &= kvcache(device, dtype, d, in_order_only=True)
        else:
            ok &= varlen(device, dtype, d) & kvcache(device, dtype, d)
    if not args.in_order_only:
        ok &= write_and_merge(device, dtype, dims[-1])
    if device.type == "cuda":
        torch.cuda.synchronize()
    print("all ok" if ok else "SOME WRONG")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
