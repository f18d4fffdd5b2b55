"""Correctness cases: one shape and option set, its inputs, and its verdicts."""

import zlib
from dataclasses import dataclass, field
from typing import List, Optional, Tuple, Union

import torch

import vflash
from vflash.harness.oracle import Verdict, compare, compare_rms, fp8_score_slack
from vflash.reference import (attention_explicit, attention_varlen_reference, attention_with_kvcache_reference,
                              write_kvcache_reference)
from vflash.reference.fp8 import attention_fp8_yardstick, dequantize, quantize, to_e4m3

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


@dataclass(frozen=True)
class Case:
    B: int = 1
    Hq: int = 2
    Hkv: int = 2
    Nq: int = 64
    Nk: int = 64
    D: int = 64
    dtype: str = "fp16"
    causal: Union[bool, str] = False
    window: Optional[Tuple[int, int]] = None
    softcap: Optional[float] = None
    scale: Optional[float] = None
    layout: str = "bhnd"  # bhnd contiguous | bnhd (transposed view) | sliced (strided view)
    amplify: float = 1.0  # multiply q and k: large logits test the running-max rescale
    sinks: bool = False  # a sink logit per query head (fp32, about the scores' size)
    Dv: Optional[int] = None  # v's head dim where it differs from q's and k's
    tag: str = field(default="", compare=False)

    @property
    def name(self) -> str:
        parts = [f"{self.dtype}", f"B{self.B}", f"H{self.Hq}/{self.Hkv}", f"N{self.Nq}x{self.Nk}",
                 f"D{self.D}" + (f"/{self.Dv}" if self.Dv else ""), f"causal={self.causal}"]
        if self.window is not None:
            parts.append(f"window={self.window[0]},{self.window[1]}")
        if self.softcap is not None:
            parts.append(f"softcap={self.softcap:g}")
        if self.scale is not None:
            parts.append(f"scale={self.scale:g}")
        if self.layout != "bhnd":
            parts.append(self.layout)
        if self.amplify != 1.0:
            parts.append(f"x{self.amplify:g}")
        if self.sinks:
            parts.append("sinks")
        if self.tag:
            parts.append(self.tag)
        return " ".join(parts)

    def seed(self) -> int:
        return zlib.crc32(self.name.encode())

    def run(self, device, attention=None) -> List[Verdict]:
        return run_case(self, device, attention)


def _make(shape_bhnd, layout: str, dtype, device, gen) -> torch.Tensor:
    B, H, N, D = shape_bhnd
    if layout == "bhnd":
        x = torch.randn(B, H, N, D, generator=gen)
    elif layout == "bnhd":
        x = torch.randn(B, N, H, D, generator=gen).transpose(1, 2)
    elif layout == "sliced":
        # Every stride odd-sized: extra heads, rows and head-dim columns sliced off.
        x = torch.randn(B, H + 1, N + 3, D + 8, generator=gen)[:, 1:, 3:, :D]
    else:
        raise ValueError(f"unknown layout {layout!r}")
    # Generated on the CPU so one seed gives the same numbers on every device.
    return x.to(device=device, dtype=dtype)


def make_sinks(on: bool, heads: int, seed: int, device) -> Optional[torch.Tensor]:
    """fp32 [heads] sink logits of about the scores' size, from the case's seed; None for a case without."""
    if not on:
        return None
    return (torch.randn(heads, generator=torch.Generator().manual_seed(seed ^ 0x5151)) * 2).to(device)


def make_inputs(case: Case, device) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(case.seed())
    dt = DTYPES[case.dtype]
    q = _make((case.B, case.Hq, case.Nq, case.D), case.layout, dt, device, gen)
    k = _make((case.B, case.Hkv, case.Nk, case.D), case.layout, dt, device, gen)
    v = _make((case.B, case.Hkv, case.Nk, case.Dv or case.D), case.layout, dt, device, gen)
    if case.amplify != 1.0:
        q, k = q * case.amplify, k * case.amplify
    return q, k, v


def run_case(case: Case, device, attention=None) -> List[Verdict]:
    """Run `attention` (default vflash.attention) on the case; judge out and lse."""
    attention = attention or vflash.attention
    q, k, v = make_inputs(case, device)
    opts = dict(causal=case.causal, scale=case.scale, window=case.window, softcap=case.softcap,
                sinks=make_sinks(case.sinks, case.Hq, case.seed(), device))
    with torch.no_grad():
        out, lse = attention(q, k, v, return_lse=True, **opts)
        ref_out, ref_lse = attention_explicit(q, k, v, compute_dtype=torch.float64, **opts)
        same_out, _ = attention_explicit(q, k, v, compute_dtype=None, **opts)
        # LSE is an fp32 output whatever the inputs: its yardstick is fp32 PyTorch.
        _, f32_lse = attention_explicit(q, k, v, compute_dtype=torch.float32, **opts)
    dt = DTYPES[case.dtype]
    shape_ok = tuple(out.shape) == tuple(ref_out.shape) and out.dtype == dt and lse.dtype == torch.float32
    if not shape_ok:
        return [Verdict("out", float("nan"), float("nan"), 0.0, False,
                        f"got out {tuple(out.shape)} {out.dtype}, lse {lse.dtype}")]
    return [compare("out", out.cpu(), ref_out.cpu(), same_out.cpu(), dt),
            compare("lse", lse.cpu(), ref_lse.cpu(), f32_lse.cpu(), torch.float32)]

def _ulp_floor(dtype: torch.dtype) -> float:
    return {torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7, torch.float32: 2.0**-23}[dtype]


@dataclass(frozen=True)
class TiledCheck:
    """The tiled PyTorch reference (fp32) against the fp64 oracle: validates the
    online-softmax recurrence itself, with tail tiles and masks."""
    Nq: int
    Nk: int
    D: int = 64
    causal: Union[bool, str] = False
    window: Optional[Tuple[int, int]] = None
    block_m: int = 64
    block_n: int = 64

    @property
    def name(self) -> str:
        extra = f" window={self.window[0]},{self.window[1]}" if self.window else ""
        return (f"tiled-vs-explicit fp32 N{self.Nq}x{self.Nk} D{self.D} causal={self.causal}{extra} "
                f"blocks {self.block_m}x{self.block_n}")

    def run(self, device, attention=None) -> List[Verdict]:
        from vflash.reference import attention_tiled
        case = Case(B=1, Hq=2, Hkv=1, Nq=self.Nq, Nk=self.Nk, D=self.D, dtype="fp32", causal=self.causal,
                    window=self.window, tag=self.name)
        q, k, v = make_inputs(case, device)
        opts = dict(causal=self.causal, window=self.window)
        out, lse = attention_tiled(q, k, v, block_m=self.block_m, block_n=self.block_n, **opts)
        ref_out, ref_lse = attention_explicit(q, k, v, compute_dtype=torch.float64, **opts)
        f32_out, f32_lse = attention_explicit(q, k, v, compute_dtype=torch.float32, **opts)
        return [compare("out", out.cpu(), ref_out.cpu(), f32_out.cpu(), torch.float32),
                compare("lse", lse.cpu(), ref_lse.cpu(), f32_lse.cpu(), torch.float32)]


@dataclass(frozen=True)
class BaselineCheck:
    """A baseline vflash is measured against (explicit attention in the inputs'
    dtype, or SDPA restricted to its flash backend) against the fp64 oracle,
    held to 4 ulps of the dtype at the output's magnitude: the baselines in
    the benchmark must compute the same function."""
    method: str  # "explicit" | "sdpa_flash"
    N: int
    D: int
    causal: bool
    dtype: str = "fp16"

    @property
    def name(self) -> str:
        return f"baseline {self.method} {self.dtype} N{self.N} D{self.D} causal={self.causal}"

    def run(self, device, attention=None) -> List[Verdict]:
        case = Case(B=2, Hq=4, Hkv=4, Nq=self.N, Nk=self.N, D=self.D, dtype=self.dtype, causal=self.causal,
                    tag=self.name)
        q, k, v = make_inputs(case, device)
        with torch.no_grad():
            if self.method == "explicit":
                out, _ = attention_explicit(q, k, v, causal=self.causal, compute_dtype=None)
            elif self.method == "sdpa_flash":
                from torch.nn.attention import SDPBackend, sdpa_kernel
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
            else:
                raise ValueError(f"unknown baseline {self.method!r}")
            ref, _ = attention_explicit(q, k, v, causal=self.causal, compute_dtype=torch.float64)
        dt = DTYPES[self.dtype]
        err = (out.double() - ref).abs()
        tol = 4 * _ulp_floor(dt) * max(1.0, ref.abs().max().item())
        ok = bool(torch.isfinite(out).all()) and err.max().item() <= tol
        return [Verdict("out", err.max().item(), err.mean().item(), tol, ok)]


@dataclass(frozen=True)
class VarlenCase:
    """`vflash.attention_varlen` on packed sequences of the given lengths, against a
    per-sequence loop over the explicit fp64 reference (same rule as Case)."""
    lens_q: Tuple[int, ...]
    lens_k: Tuple[int, ...]
    Hq: int = 4
    Hkv: int = 2
    D: int = 64
    dtype: str = "fp16"
    causal: Union[bool, str] = False
    window: Optional[Tuple[int, int]] = None
    softcap: Optional[float] = None
    sinks: bool = False
    tag: str = field(default="", compare=False)

    @property
    def name(self) -> str:
        lens = ",".join(f"{q}x{k}" for q, k in zip(self.lens_q, self.lens_k))
        parts = [self.dtype, f"varlen[{lens}]", f"H{self.Hq}/{self.Hkv}", f"D{self.D}", f"causal={self.causal}"]
        if self.window is not None:
            parts.append(f"window={self.window[0]},{self.window[1]}")
        if self.softcap is not None:
            parts.append(f"softcap={self.softcap:g}")
        if self.sinks:
            parts.append("sinks")
        return " ".join(parts + ([self.tag] if self.tag else []))

    def run(self, device, attention=None) -> List[Verdict]:
        gen = torch.Generator(device="cpu").manual_seed(zlib.crc32(self.name.encode()))
        dt = DTYPES[self.dtype]
        tq, tk = sum(self.lens_q), sum(self.lens_k)
        q = torch.randn(tq, self.Hq, self.D, generator=gen).to(dt).to(device)
        k, v = (torch.randn(tk, self.Hkv, self.D, generator=gen).to(dt).to(device) for _ in range(2))
        cq, ck = (torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device=device)
                  for lens in (self.lens_q, self.lens_k))
        opts = dict(causal=self.causal, window=self.window, softcap=self.softcap,
                    sinks=make_sinks(self.sinks, self.Hq, zlib.crc32(self.name.encode()), device))
        out, lse = vflash.attention_varlen(q, k, v, cq, ck, max(self.lens_q), max(self.lens_k), return_lse=True,
                                           **opts)
        ref_o, ref_l = attention_varlen_reference(q, k, v, cq, ck, compute_dtype=torch.float64, **opts)
        same_o, _ = attention_varlen_reference(q, k, v, cq, ck, compute_dtype=None, **opts)
        _, same_l = attention_varlen_reference(q, k, v, cq, ck, compute_dtype=torch.float32, **opts)
        return [compare("out", out.cpu(), ref_o.cpu(), same_o.cpu(), dt),
                compare("lse", lse.cpu(), ref_l.cpu(), same_l.cpu(), torch.float32)]


@dataclass(frozen=True)
class Fp8Case:
    """FP8 (e4m3) inputs with their descales through `vflash.attention`, or packed through
    `vflash.attention_varlen` when `lens` gives each sequence's (n_q, n_k): the fp64 oracle on the dequantized
    inputs, the explicit FP8 pipeline (vflash.reference.fp8) as the yardstick, max error and RMSE within twice
    the yardstick's plus the output dtype's floor (oracle.compare_rms); the LSE against fp32 explicit attention
    on the dequantized inputs, on a GPU with the tensor cores' FP8 accumulation bound added
    (oracle.fp8_score_slack)."""
    B: int = 1
    Hq: int = 2
    Hkv: int = 2
    Nq: int = 64
    Nk: int = 64
    D: int = 64
    causal: Union[bool, str] = False
    window: Optional[Tuple[int, int]] = None
    softcap: Optional[float] = None
    sinks: bool = False
    descale: str = "tensor"  # "tensor" (0-d), "head" ([B, Hkv]) or "none" (None: the values stored as they are)
    out_dtype: str = "bf16"
    lens: Optional[Tuple[Tuple[int, int], ...]] = None
    tag: str = field(default="", compare=False)

    @property
    def name(self) -> str:
        shape = (f"varlen[{','.join(f'{a}x{b}' for a, b in self.lens)}]" if self.lens else
                 f"B{self.B} N{self.Nq}x{self.Nk}")
        parts = ["fp8", shape, f"H{self.Hq}/{self.Hkv}", f"D{self.D}", f"causal={self.causal}"]
        if self.window is not None:
            parts.append(f"window={self.window[0]},{self.window[1]}")
        if self.softcap is not None:
            parts.append(f"softcap={self.softcap:g}")
        if self.sinks:
            parts.append("sinks")
        parts += [f"descale={self.descale}", f"out={self.out_dtype}"]
        return " ".join(parts + ([self.tag] if self.tag else []))

    def _descale(self, x: torch.Tensor, group: int) -> Optional[torch.Tensor]:
        # the descale that maps x's largest magnitude (of the tensor, or of each sequence's KV head) to 448
        if self.descale == "none":
            return None
        if self.descale == "tensor":
            return (x.abs().amax() / 448.0).clamp_min(2.0**-20).float()
        b, h = x.shape[0], x.shape[1] // group
        return (x.reshape(b, h, -1).abs().amax(-1) / 448.0).clamp_min(2.0**-20).float()  # an empty sequence: any

    def run(self, device, attention=None) -> List[Verdict]:
        seed = zlib.crc32(self.name.encode())
        gen = torch.Generator().manual_seed(seed)
        seqs = self.lens or ((self.Nq, self.Nk),) * self.B
        group = self.Hq // self.Hkv
        # real values of about unit size (x4 where the descale is none: the stored values are the real ones)
        size = 1.0 if self.descale != "none" else 4.0
        dense = [tuple(torch.randn(1, h, n, self.D, generator=gen) * size for h, n in
                       ((self.Hq, nq), (self.Hkv, nk), (self.Hkv, nk))) for nq, nk in seqs]
        if self.lens is None:
            real = [torch.cat([s[i] for s in dense]) for i in range(3)]
        else:  # one [B, H, n_max, D] batch only to size the per-sequence descales
            real = [torch.cat([torch.nn.functional.pad(s[i], (0, 0, 0, max(x[i].shape[2] for x in dense)
                                                              - s[i].shape[2])) for s in dense]) for i in range(3)]
        descales = [self._descale(x, g) for x, g in zip(real, (group, 1, 1))]
        sinks = make_sinks(self.sinks, self.Hq, seed, "cpu")
        opts = dict(causal=self.causal, window=self.window, softcap=self.softcap)
        out_dt = DTYPES[self.out_dtype]
        stored, refs, slack = [], [], 0.0
        for b, seq in enumerate(dense):  # each sequence's e4m3 tensors, oracle, yardstick and LSE yardstick
            d_b = [None if d is None else (d if d.dim() == 0 else d[b:b + 1]) for d in descales]
            q8, k8, v8 = (quantize(x, d, g) for x, d, g in zip(seq, d_b, (group, 1, 1)))
            real_b = [dequantize(x, d, g) for x, d, g in zip((q8, k8, v8), d_b, (group, 1, 1))]
            ref_o, ref_l = attention_explicit(*real_b, compute_dtype=torch.float64, sinks=sinks, **opts)
            _, f32_l = attention_explicit(*real_b, compute_dtype=torch.float32, sinks=sinks, **opts)
            yard = attention_fp8_yardstick(q8, k8, v8, *d_b, sinks=sinks, out_dtype=out_dt, **opts)
            slack = max(slack, fp8_score_slack(real_b[0], real_b[1].repeat_interleave(group, 1), self.D ** -0.5))
            stored.append((q8, k8, v8))
            refs.append((ref_o, ref_l, f32_l, yard))
        dev = [None if d is None else d.to(device) for d in descales]
        kwargs = dict(q_descale=dev[0], k_descale=dev[1], v_descale=dev[2], out_dtype=out_dt, return_lse=True,
                      sinks=None if sinks is None else sinks.to(device), **opts)
        with torch.no_grad():
            if self.lens is None:
                q8, k8, v8 = (torch.cat([s[i] for s in stored]).to(device) for i in range(3))
                out, lse = (attention or vflash.attention)(q8, k8, v8, **kwargs)
                out, lse = out.cpu(), lse.cpu()
            else:  # packed [total, H, D]
                q8, k8, v8 = (torch.cat([s[i][0].transpose(0, 1) for s in stored]).to(device) for i in range(3))
                cu = [torch.tensor([0] + torch.tensor([s[j] for s in seqs]).cumsum(0).tolist(), dtype=torch.int32,
                                   device=device) for j in (0, 1)]
                out, lse = vflash.attention_varlen(q8, k8, v8, cu[0], cu[1], max(s[0] for s in seqs),
                                                   max(s[1] for s in seqs), **kwargs)
                # back to [B, H, n, D] pieces, sequence by sequence
                starts = cu[0].tolist()
                out = [out[a:z].transpose(0, 1)[None].cpu() for a, z in zip(starts, starts[1:])]
                lse = [lse[:, a:z][None].cpu() for a, z in zip(starts, starts[1:])]
        if out_dt != (out.dtype if self.lens is None else out[0].dtype):
            return [Verdict("out", float("nan"), float("nan"), 0.0, False, f"out dtype is not {out_dt}")]
        ref_o, ref_l, f32_l, yard = (torch.cat([r[i].reshape(-1) for r in refs]) for i in range(4))
        got_o = out.reshape(-1) if self.lens is None else torch.cat([o.reshape(-1) for o in out])
        got_l = lse.reshape(-1) if self.lens is None else torch.cat([x.reshape(-1) for x in lse])
        return [compare_rms("out", got_o, ref_o, yard, out_dt),
                compare("lse", got_l, ref_l, f32_l, torch.float32,
                        slack=slack if torch.device(device).type == "cuda" else 0.0)]


@dataclass(frozen=True)
class KVCacheCase:
    """`vflash.attention_with_kvcache` on a shuffled paged cache (lens_q new queries per
    sequence, packed, against lens_k cached keys, its own included), against the paged
    reference (each sequence's pages gathered, explicit fp64 attention; same rule as Case).
    The cache's rows past each length and its unused pages hold NaN. latent: v_cache is k_cache's
    first Dv columns, a view (MLA's latent cache: D 576, Dv 512)."""
    lens_q: Tuple[int, ...]
    lens_k: Tuple[int, ...]
    page: int = 16
    Hq: int = 8
    Hkv: int = 2
    D: int = 64
    dtype: str = "fp16"
    causal: bool = True
    window: Optional[Tuple[int, int]] = None
    softcap: Optional[float] = None
    num_splits: Optional[int] = None
    batch_invariant: bool = False
    sinks: bool = False
    # an FP8 cache, its descales "tensor" (0-d), "head" ([Hkv]) or "seq" ([B, Hkv]); "": the cache in q's dtype.
    # The oracle then runs on the dequantized cache, and the yardstick is explicit attention in q's dtype on it.
    fp8: str = ""
    Dv: Optional[int] = None  # v's head dim where it differs from q's and k's
    latent: bool = False
    # q as [B, Nq, Hq, D] without cu_seqlens_q (lens_q all Nq), the form the sm90 MLA kernel takes; else packed
    dense_q: bool = False
    tag: str = field(default="", compare=False)

    def __post_init__(self):
        if self.dense_q and len(set(self.lens_q)) != 1:
            raise ValueError(f"dense_q needs one count of new queries a sequence, got {self.lens_q}")

    @property
    def name(self) -> str:
        lens = ",".join(f"{q}x{k}" for q, k in zip(self.lens_q, self.lens_k))
        cache = f" fp8-cache({self.fp8})" if self.fp8 else ""
        parts = [self.dtype + cache, f"kvcache[{lens}] page={self.page}", f"H{self.Hq}/{self.Hkv}",
                 f"D{self.D}" + (f"/{self.Dv}" if self.Dv else "") + (" latent" if self.latent else ""),
                 f"causal={self.causal}"]
        if self.window is not None:
            parts.append(f"window={self.window[0]},{self.window[1]}")
        if self.softcap is not None:
            parts.append(f"softcap={self.softcap:g}")
        if self.num_splits is not None:
            parts.append(f"splits={self.num_splits}")
        if self.batch_invariant:
            parts.append("batch-invariant")
        if self.sinks:
            parts.append("sinks")
        if self.dense_q:
            parts.append("dense-q")
        return " ".join(parts + ([self.tag] if self.tag else []))

    def run(self, device, attention=None) -> List[Verdict]:
        gen = torch.Generator(device="cpu").manual_seed(zlib.crc32(self.name.encode()))
        dt = DTYPES[self.dtype]
        need = [max(1, -(-n // self.page)) for n in self.lens_k]
        pages = sum(need) + 2
        order = torch.randperm(pages, generator=gen).tolist()
        table = torch.zeros(len(need), max(need), dtype=torch.int32)
        used = 0
        for b, n in enumerate(need):
            table[b, :n] = torch.tensor(order[used:used + n], dtype=torch.int32)
            used += n
        k_cache, v_cache = (torch.randn(pages, self.page, self.Hkv, d, generator=gen)
                            for d in (self.D, self.Dv or self.D))
        if self.latent:
            v_cache = k_cache[..., :self.Dv]
        # NaN in every row no sequence holds: past each length in its last page, and the unused pages
        unused = torch.ones(pages, self.page, dtype=torch.bool)
        for b, n in enumerate(self.lens_k):
            for j in range(need[b]):
                unused[table[b, j], :max(0, min(self.page, n - j * self.page))] = False
        k_cache, v_cache = (x.masked_fill(unused[:, :, None, None], float("nan")) for x in (k_cache, v_cache))
        descales = {}
        if self.fp8:  # stored in e4m3 with their descales; the references read the dequantized caches
            page_seq = torch.zeros(pages, dtype=torch.long)
            for b, n in enumerate(need):
                page_seq[table[b, :n].long()] = b
            k_cache, descales["k_descale"], k_real = _fp8_cache(k_cache, page_seq, self.fp8, len(need))
            if self.latent:  # one cache, one descale
                v_cache, descales["v_descale"], v_real = (k_cache[..., :self.Dv], descales["k_descale"],
                                                          k_real[..., :self.Dv])
            else:
                v_cache, descales["v_descale"], v_real = _fp8_cache(v_cache, page_seq, self.fp8, len(need))
            k_cache = k_cache.to(device)
            v_cache = k_cache[..., :self.Dv] if self.latent else v_cache.to(device)
            descales = {n: d.to(device) for n, d in descales.items()}
            k_ref, v_ref = k_real.to(device), v_real.to(device)
        else:
            k_cache = k_cache.to(dt).to(device)
            v_cache = k_cache[..., :self.Dv] if self.latent else v_cache.to(dt).to(device)
            k_ref, v_ref = k_cache, v_cache
        q = torch.randn(sum(self.lens_q), self.Hq, self.D, generator=gen).to(dt).to(device)
        table = table.to(device)
        lens = torch.tensor(self.lens_k, dtype=torch.int32, device=device)
        cu = torch.tensor([0] + torch.tensor(self.lens_q).cumsum(0).tolist(), dtype=torch.int32, device=device)
        opts = dict(causal=self.causal, window=self.window, softcap=self.softcap,
                    sinks=make_sinks(self.sinks, self.Hq, zlib.crc32(self.name.encode()), device))
        call = dict(num_splits=self.num_splits, batch_invariant=self.batch_invariant, return_lse=True, **descales,
                    **opts)
        if self.dense_q:  # [B, Nq, Hq, D] in, [B, Nq, Hq, Dv] and LSE [B, Hq, Nq] out: packed again to compare
            nq = self.lens_q[0]
            out, lse = vflash.attention_with_kvcache(q.view(len(self.lens_q), nq, self.Hq, self.D), k_cache, v_cache,
                                                     lens, block_table=table, **call)
            out, lse = out.flatten(0, 1), lse.transpose(0, 1).flatten(1)
        else:
            out, lse = vflash.attention_with_kvcache(q, k_cache, v_cache, lens, block_table=table, cu_seqlens_q=cu,
                                                     max_seqlen_q=max(self.lens_q), **call)
        # the yardstick in q's dtype: the (dequantized) caches in it too
        ref = {c: attention_with_kvcache_reference(q, k_ref if c else k_ref.to(dt), v_ref if c else v_ref.to(dt),
                                                   lens, table, cu, compute_dtype=c, **opts)
               for c in (torch.float64, None, torch.float32)}
        return [compare("out", out.cpu(), ref[torch.float64][0].cpu(), ref[None][0].cpu(), dt),
                compare("lse", lse.cpu(), ref[torch.float64][1].cpu(), ref[torch.float32][1].cpu(), torch.float32)]


def _fp8_cache(x: torch.Tensor, page_seq: torch.Tensor, how: str, batch: int):
    """A paged cache x [pages, page_size, Hkv, D] (fp32) stored in e4m3: (stored, descale, the stored values
    dequantized in fp64). how: "tensor" (0-d), "head" ([Hkv]) or "seq" ([B, Hkv]: a page takes its
    sequence's row, page_seq[page]), each at or above the largest magnitude / 448 (no saturation)."""
    size = x.nan_to_num().abs()  # the NaN rows no sequence holds do not size the descales
    per_head = size.amax((0, 1, 3)) / 448.0  # [Hkv]
    if how == "tensor":
        descale = size.amax() / 448.0
        per_page = descale.expand(x.shape[0], x.shape[2])
    elif how == "head":
        descale = per_head
        per_page = descale.expand(x.shape[0], -1)
    elif how == "seq":
        descale = per_head[None, :] * (1.0 + 0.5 * torch.arange(batch))[:, None]
        per_page = descale[page_seq]
    else:
        raise ValueError(f"fp8 must be tensor, head or seq, got {how!r}")
    per_page = per_page.float()[:, None, :, None]  # [pages, 1, Hkv, 1]
    stored = to_e4m3(x / per_page)
    return stored, descale.float().contiguous(), stored.double() * per_page.double()


@dataclass(frozen=True)
class MergeCase:
    """`vflash.merge_states` of attention over the keys split at `split`: `vflash.attention` on
    each part (causal: the first part's band top-left, the second's bottom-right, so each query
    sees its own keys of the part; queries before the split see none of the second and get LSE
    -inf), merged, against attention over all the keys (explicit fp64; same rule as Case)."""
    N: int
    split: int
    B: int = 1
    Hq: int = 4
    Hkv: int = 2
    D: int = 64
    dtype: str = "fp16"
    causal: bool = False
    tag: str = field(default="", compare=False)

    @property
    def name(self) -> str:
        parts = [self.dtype, f"merge B{self.B} H{self.Hq}/{self.Hkv} N{self.N} split {self.split}", f"D{self.D}",
                 f"causal={self.causal}"]
        return " ".join(parts + ([self.tag] if self.tag else []))

    def run(self, device, attention=None) -> List[Verdict]:
        case = Case(B=self.B, Hq=self.Hq, Hkv=self.Hkv, Nq=self.N, Nk=self.N, D=self.D, dtype=self.dtype,
                    causal=self.causal, tag=self.name)
        q, k, v = make_inputs(case, device)
        s = self.split
        with torch.no_grad():
            a, la = vflash.attention(q, k[:, :, :s], v[:, :, :s], causal="top_left" if self.causal else False,
                                     return_lse=True)
            b, lb = vflash.attention(q, k[:, :, s:], v[:, :, s:], causal=self.causal, return_lse=True)
            out, lse = vflash.merge_states(a, la, b, lb)
            ref_out, ref_lse = attention_explicit(q, k, v, causal=self.causal, compute_dtype=torch.float64)
            same_out, _ = attention_explicit(q, k, v, causal=self.causal, compute_dtype=None)
            _, f32_lse = attention_explicit(q, k, v, causal=self.causal, compute_dtype=torch.float32)
        dt = DTYPES[self.dtype]
        return [compare("out", out.cpu(), ref_out.cpu(), same_out.cpu(), dt),
                compare("lse", lse.cpu(), ref_lse.cpu(), f32_lse.cpu(), torch.float32)]


@dataclass(frozen=True)
class CacheWriteCase:
    """`vflash.write_kvcache` of `tokens` new tokens at shuffled distinct slots of a paged cache
    (every `pad_every`-th slot -1, skipped), against the reference's copy: bitwise the same cache."""
    tokens: int
    blocks: int
    page: int = 16
    Hkv: int = 2
    D: int = 64
    dtype: str = "fp16"
    pad_every: int = 0
    tag: str = field(default="", compare=False)

    @property
    def name(self) -> str:
        parts = [self.dtype, f"write_kvcache T{self.tokens} into {self.blocks} pages of {self.page}",
                 f"H{self.Hkv}", f"D{self.D}"] + ([f"-1 every {self.pad_every}"] if self.pad_every else [])
        return " ".join(parts + ([self.tag] if self.tag else []))

    def run(self, device, attention=None) -> List[Verdict]:
        gen = torch.Generator(device="cpu").manual_seed(zlib.crc32(self.name.encode()))
        dt = DTYPES[self.dtype]
        k_cache, v_cache = (torch.randn(self.blocks, self.page, self.Hkv, self.D, generator=gen).to(dt).to(device)
                            for _ in range(2))
        k_new, v_new = (torch.randn(self.tokens, self.Hkv, self.D, generator=gen).to(dt).to(device) for _ in range(2))
        slots = torch.randperm(self.blocks * self.page, generator=gen)[:self.tokens]
        if self.pad_every:
            slots[::self.pad_every] = -1
        slots = slots.to(device)
        want_k, want_v = write_kvcache_reference(k_cache, v_cache, k_new, v_new, slots)
        vflash.write_kvcache(k_cache, v_cache, k_new, v_new, slots)
        verdicts = []
        for what, got, want in (("k_cache", k_cache, want_k), ("v_cache", v_cache, want_v)):
            err = (got.double() - want.double()).abs()
            same = torch.equal(got, want)
            verdicts.append(Verdict(what, err.max().item(), err.mean().item(), 0.0, same,
                                    "" if same else "differs from the reference's copy"))
        return verdicts


@dataclass(frozen=True)
class GradCase:
    """The backward of `vflash.attention` on a Case's inputs: dq, dk, dv (and dsinks, a case with
    sinks) against fp64 autograd of the explicit reference, with the 3x rule (DESIGN.md: at most 3x
    the same-dtype PyTorch error plus the floor; dsinks, an fp32 output, against fp32 PyTorch's)."""
    case: Case

    @property
    def name(self) -> str:
        return f"grad {self.case.name}"

    def run(self, device, attention=None) -> List[Verdict]:
        attention = attention or vflash.attention
        c = self.case
        q, k, v = make_inputs(c, device)
        dt = DTYPES[c.dtype]
        gen = torch.Generator().manual_seed(c.seed() + 1)
        do = torch.randn(c.B, c.Hq, c.Nq, c.Dv or c.D, generator=gen).to(device=device, dtype=dt)
        opts = dict(causal=c.causal, scale=c.scale, window=c.window, softcap=c.softcap)
        sinks = make_sinks(c.sinks, c.Hq, c.seed(), device)

        def grads(fn, dtype, sinks_dtype):
            leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
            if sinks is not None:
                leaves.append(sinks.to(sinks_dtype).requires_grad_())
            out = fn(*leaves)
            out = out[0] if isinstance(out, tuple) else out
            return torch.autograd.grad(out, leaves, do.to(dtype))
        got = grads(lambda a, b, x, *s: attention(a, b, x, sinks=s[0] if s else None, **opts), dt, torch.float32)
        ref = grads(lambda a, b, x, *s: attention_explicit(a, b, x, sinks=s[0] if s else None,
                                                           compute_dtype=torch.float64, **opts),
                    torch.float64, torch.float64)
        same = grads(lambda a, b, x, *s: attention_explicit(a, b, x, sinks=s[0] if s else None, compute_dtype=None,
                                                            **opts), dt, torch.float32)
        names = ("dq", "dk", "dv", "dsinks")
        return [compare(name, g.cpu(), r.cpu(), s.cpu(), torch.float32 if name == "dsinks" else dt, factor=3.0)
                for name, g, r, s in zip(names, got, ref, same)]
