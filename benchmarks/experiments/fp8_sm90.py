"""The sm90 kernel's FP8 build against the portable FP8 forward, on the GPU, before dispatch chooses it
(tables.SM90_FORCED_ONLY): each kernel forced in turn (plans off; the sm90 build with P from registers, the
table's, and through shared memory, P_SHARED), its output and LSE against fp64 attention on the dequantized
inputs (explicit, on fp64), then the issue's bar shapes timed (triton.testing.do_bench, median): FP8 sm90
(both), FP8 portable and bf16 vflash, in TFLOP/s. --tiles: candidate sm90 FP8 tiles
(D:block_m:block_n:stages:q_buffers[:ps][:pp][:lz]; switches: ps P through shared memory, pp PINGPONG, lz
LAZY_RESCALE), each checked against the same fp64 reference at a small shape, then timed at its head dim's bar
shape beside the table's (a candidate of the table's own tiles times it again, for the run's clock drift).

  PYTHONPATH=src:. python3 -m benchmarks.experiments.fp8_sm90 [--tiles 128:128:128:3:2 256:128:128:2:1 ...]
"""

import argparse

import torch
import triton

import vflash
from vflash.dispatch import rules, tables
from vflash.harness import lab

E4M3 = torch.float8_e4m3fn


def _inputs(B, Hq, Hkv, N, D, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(B, h, N, D, device="cuda", generator=g).to(E4M3) for h in (Hq, Hkv, Hkv))
    descales = (torch.rand(B, Hkv, device="cuda", generator=g) + 0.5, torch.rand((), device="cuda", generator=g) + 0.5,
                torch.rand(B, Hkv, device="cuda", generator=g) + 0.5)
    return q, k, v, descales


def _forced(kernel, fn):
    # kernel "portable", "sm90" (the table's tiles) or "sm90 P shared" (P through shared memory)
    table = dict(tables.SM90_FP8)
    rules.FORCED = kernel.split()[0]
    if kernel == "sm90 P shared":
        tables.SM90_FP8.update({key: t._replace(p_shared=True) for key, t in table.items()})
    try:
        with lab.plans_off():
            return fn()
    finally:
        rules.FORCED = None
        tables.SM90_FP8.update(table)


def check(B, Hq, Hkv, N, D, causal):
    q, k, v, (qd, kd, vd) = _inputs(B, Hq, Hkv, N, D)
    g = Hq // Hkv
    real_q = q.double() * qd.double().repeat_interleave(g, 1)[..., None, None]
    real_k, real_v = k.double() * kd.double(), v.double() * vd.double()[..., None, None]
    s = real_q @ real_k.repeat_interleave(g, 1).transpose(-1, -2) * D ** -0.5
    if causal:
        s = s.masked_fill(torch.ones(N, N, device="cuda", dtype=torch.bool).triu(1), float("-inf"))
    ref_lse = torch.logsumexp(s, -1)
    ref = torch.softmax(s, -1) @ real_v.repeat_interleave(g, 1)
    for kernel in ("portable", "sm90", "sm90 P shared"):
        try:
            out, lse = _forced(kernel, lambda: vflash.attention(q, k, v, causal=causal, q_descale=qd, k_descale=kd,
                                                                v_descale=vd, return_lse=True))
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - report and go on
            print(f"B {B} H {Hq}/{Hkv} N {N} D {D} causal {causal} {kernel}: {type(e).__name__} {str(e)[:200]}",
                  flush=True)
            continue
        err = (out.double() - ref).abs()
        print(f"B {B} H {Hq}/{Hkv} N {N} D {D} causal {causal} {kernel:13s}: out max {err.max().item():.4f} "
              f"rmse {err.pow(2).mean().sqrt().item():.5f} lse max {(lse.double() - ref_lse).abs().max().item():.5f} "
              f"nan {bool(torch.isnan(out).any())}", flush=True)


# the bar shapes (B, H, N, D), non-causal, by head dim
BAR_SHAPES = {128: (1, 16, 16384, 128), 256: (1, 8, 16384, 256)}


def _fp8_call(kernel, q, k, v, descales):
    # vflash.attention on FP8 inputs with `kernel` forced (_forced's names)
    qd, kd, vd = descales
    return lambda: _forced(kernel, lambda: vflash.attention(q, k, v, q_descale=qd, k_descale=kd, v_descale=vd))


def _bench(label, fn, flops):
    # one timing line: the median's ms and TFLOP/s, or the error
    try:
        ms = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
        print(f"{label}: {ms:.3f} ms {flops / ms / 1e9:.0f} TFLOP/s", flush=True)
    except Exception as e:  # noqa: BLE001 - report and go on
        print(f"{label}: {type(e).__name__} {str(e)[:200]}", flush=True)


def speed(B, H, N, D):
    q, k, v, descales = _inputs(B, H, H, N, D)
    v_t = lab.keys_contiguous(v, 2)  # as the portable FP8 kernel takes V without a copy
    b = tuple(x.to(torch.bfloat16) for x in (q, k, v))
    calls = {  # the sm90 build copies V each call (keys contiguous, in its P's order: lab.sm90_e4m3_values)
        "fp8 sm90": _fp8_call("sm90", q, k, v, descales),
        "fp8 sm90 P shared": _fp8_call("sm90 P shared", q, k, v, descales),
        "fp8 portable": _fp8_call("portable", q, k, v_t, descales),
        "fp8 portable V copied": _fp8_call("portable", q, k, v, descales),
        "bf16 vflash": lambda: vflash.attention(*b),
    }
    for name, fn in calls.items():
        _bench(f"B {B} H {H} N {N} D {D} {name:20s}", fn, 4 * B * H * N * N * D)
    for name, copy in (("sm90 V copy", lambda: lab.sm90_e4m3_values(v)),
                       ("portable V copy", lambda: lab.keys_contiguous(v, 2))):
        try:  # each build's V copy alone (its share of the call), and its GB/s (read and write)
            ms = triton.testing.do_bench(copy, warmup=25, rep=100, return_mode="median")
            print(f"B {B} H {H} N {N} D {D} {name:20s}: {ms:.3f} ms {2 * v.numel() / ms / 1e6:.0f} GB/s", flush=True)
        except Exception as e:  # noqa: BLE001 - report and go on
            print(f"{name}: {type(e).__name__} {str(e)[:200]}", flush=True)


_SWITCHES = {"ps": "p_shared", "pp": "pingpong", "lz": "lazy_rescale"}


def _tiles_of(spec: str):
    # "D:block_m:block_n:stages:q_buffers[:switch...]" -> (D, Sm90Tiles); switches ps, pp, lz (_SWITCHES)
    d, bm, bn, stages, qb, *rest = spec.split(":")
    unknown = set(rest) - set(_SWITCHES)
    if unknown:
        raise SystemExit(f"unknown switch {sorted(unknown)} in {spec!r}; switches: {_SWITCHES}")
    return int(d), lab.Sm90Tiles(int(bm), int(bn), int(stages), q_buffers=int(qb),
                                 **{_SWITCHES[r]: True for r in rest})


def candidates(specs):
    # each candidate as the table's non-causal tiles of its head dim: checked (a small shape), then timed at the
    # bar shape of that head dim
    for spec in specs:
        d, tiles = _tiles_of(spec)
        saved = tables.SM90_FP8[(d, False)]
        tables.SM90_FP8[(d, False)] = tiles
        try:
            print(f"-- candidate {spec}: {tiles}", flush=True)
            check(2, 4, 2, 1000, d, False)
            if d in BAR_SHAPES:
                B, H, N, D = BAR_SHAPES[d]
                q, k, v, descales = _inputs(B, H, H, N, D)
                _bench(f"CANDIDATE {spec} B {B} H {H} N {N} D {D}",
                       _fp8_call("sm90", q, k, v, descales), 4 * B * H * N * N * D)
        finally:
            tables.SM90_FP8[(d, False)] = saved


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiles", nargs="*", default=[], help="D:block_m:block_n:stages:q_buffers[:ps][:pp][:lz]")
    args = ap.parse_args()
    print(torch.cuda.get_device_name(), flush=True)
    for shape in [(2, 4, 2, 300, 128, False), (2, 4, 2, 300, 128, True), (1, 8, 8, 1024, 64, False),
                  (1, 4, 4, 512, 256, True), (1, 4, 2, 2048, 128, False)]:
        check(*shape)
    for shape in BAR_SHAPES.values():
        speed(*shape)
    candidates(args.tiles)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
