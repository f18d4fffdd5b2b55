"""The lab's window on the library's internals: what the lab scripts (benchmarks/experiments, benchmarks/tune.py)
tune, time and compile, each under one name here.

The public API chooses a kernel and tiles for every call (vflash.dispatch) and replays launch plans for
repeats. A lab script asks other questions: how a candidate tile times against the table's, what a call
costs on the host piece by piece, what ptxas made of a build. For that it needs the launchers with their
tiles forced, the launches a call makes, the launch plans, and the sm_90 builds; they are gathered here so
that a refactor of vflash.ops or vflash.kernels changes this module and no script, and so that a script
that compares two source trees (ptx_fingerprint, the A/B scripts) runs against both.

Not a user API: these take validated inputs and a folded mask (a Band, not causal / window), check nothing,
and change with the kernels.

Masks and tiles
  Band, mask_band, sequence_band      the folded mask (diagonal offset, left and right edges) of a call
  Score, Call, Packed, Cache          a call's score options, a validated call and its layouts (vflash.call)
  PortableTiles, Sm90Tiles, BackwardLaunch, BackwardTiles, KVCacheTiles, MergeTiles, CacheWriteTiles,
  MetadataTiles
Launchers with their tiles forced (nothing validated, no plan recorded), the kernel the tiles name
  kernel_of                           the kernel family a tile type belongs to ("portable" or "sm90")
  keys_contiguous                     V laid out as the portable FP8 kernel takes it (keys at unit stride)
  sm90_e4m3_values                    V laid out as the sm90 FP8 build takes it (a copy: keys contiguous, in P's order)
  attention_forward, attention_varlen_forward, attention_kvcache_forward, attention_backward, merge_states_forward,
  write_kvcache_forward, sequence_metadata_flags
Launches
  KernelLaunch, run_launch            one kernel launch as a launcher builds it, and running it
  capturing_launches, captured_launches   the launches calls make, kept instead of run
Launch plans (the host fast path of repeated calls)
  plans_off, clear_plans, recorded_plans, plan_key, kvcache_plan_key, lookup_plan, triton_launcher_only
The sm_90 kernels
  HAVE_GLUON, CONSUMER_ROWS, CONSUMER_REGS, sm90_launch, sm90_grid             the Gluon forward
  MlaTiles, mla_launches                                                      the Gluon MLA decode (and its merge)
  sm90_dq_launch, sm90_dkdv_launch, SM90_BWD_STAGES                           the Gluon backward
Builds without a GPU
  compiled_path, compile_launch_sm90, sm90_builds, compile_sm90_forward
Device functions for prototype kernels
  fold_splits                         split-KV's merge of fp32 partials (@triton.jit)
"""

import contextlib
import types
from typing import Callable, Iterator, List
from unittest import mock


from vflash import _backend
from vflash.kernels import gluon_sm90 as _gluon
from vflash.kernels.combine import fold_splits
from vflash.ops import sm90 as _sm90
from vflash.ops import sm90_bwd as _sm90_bwd
from vflash.ops import launch as _launches
from vflash.ops import plans as _plans
from vflash.ops import attention as _attention
from vflash.ops import tiles as _tiles
from vflash.ops.attention_bwd import attention_backward
from vflash.call import ATTENTION, ATTENTION_KVCACHE, Band, Cache, Call, Packed, Score
from vflash._validate import mask_band, sequence_band
from vflash.ops.cache import write_kvcache_forward
from vflash.ops.combine import merge_states_forward
from vflash.ops.launch import KernelLaunch
from vflash.ops.metadata import sequence_metadata_flags
from vflash.ops.tma import keys_contiguous, sm90_e4m3_values
from vflash.ops.mla_sm90 import mla_launches
from vflash.ops.tiles import (BackwardLaunch, BackwardTiles, CacheWriteTiles, Sm90Tiles, KVCacheTiles, MergeTiles,
                              MetadataTiles, MlaTiles, PortableTiles)

__all__ = [
    "Band", "mask_band", "sequence_band", "Score", "Call", "Packed", "Cache",
    "PortableTiles", "Sm90Tiles", "BackwardLaunch", "BackwardTiles", "KVCacheTiles", "MergeTiles", "CacheWriteTiles",
    "MetadataTiles",
    "kernel_of", "keys_contiguous", "sm90_e4m3_values",
    "attention_forward", "attention_varlen_forward", "attention_kvcache_forward", "attention_backward",
    "merge_states_forward", "write_kvcache_forward", "sequence_metadata_flags",
    "KernelLaunch", "run_launch", "capturing_launches", "captured_launches",
    "plans_off", "clear_plans", "recorded_plans", "plan_key", "kvcache_plan_key", "lookup_plan",
    "triton_launcher_only",
    "HAVE_GLUON", "CONSUMER_ROWS", "CONSUMER_REGS", "sm90_launch", "sm90_grid",
    "sm90_dq_launch", "sm90_dkdv_launch", "SM90_BWD_STAGES", "MlaTiles", "mla_launches",
    "compiled_path", "compile_launch_sm90", "sm90_builds", "compile_sm90_forward",
    "fold_splits",
]


def kernel_of(tiles) -> str:
    """The kernel family a tile type belongs to (vflash.dispatch's Choice.kernel): Sm90Tiles and MlaTiles the
    sm90 kernels, every other type the portable ones. The library takes the kernel from dispatch's choice; a
    lab script that forces tiles names the kernel through them."""
    return "sm90" if isinstance(tiles, (Sm90Tiles, MlaTiles)) else "portable"


def _kernel_from_tiles(launcher: Callable) -> Callable:
    """`launcher` (an ops.attention forward launcher) with its kernel the forced tiles' (kernel_of) unless named."""
    def run(*args, tiles, kernel=None, **kw):
        return launcher(*args, tiles=tiles, kernel=kernel or kernel_of(tiles), **kw)
    run.__name__, run.__doc__ = launcher.__name__, f"vflash.ops.attention.{launcher.__name__}, its kernel the tiles'."
    return run


attention_forward = _kernel_from_tiles(_attention.attention_forward)
attention_varlen_forward = _kernel_from_tiles(_attention.attention_varlen_forward)
attention_kvcache_forward = _kernel_from_tiles(_attention.attention_kvcache_forward)

# --- launches ---

run_launch = _launches.run  # (launch, device): compiled for a CUDA device, interpreted for CPU tensors


@contextlib.contextmanager
def capturing_launches() -> Iterator[List[KernelLaunch]]:
    """Inside, every kernel launch is appended to the yielded list instead of run, and plans are off
    (plans_off), so each call builds its launches on the full path. The calls' outputs are then
    garbage; a call that reads a kernel's result on the host (a metadata check) needs its check off."""
    got: List[KernelLaunch] = []
    with mock.patch.object(_launches, "run", lambda launch, device: got.append(launch)), plans_off():
        yield got


def captured_launches(call: Callable[[], object]) -> List[KernelLaunch]:
    """The launches `call` makes, in order, built but not run (capturing_launches)."""
    with capturing_launches() as got:
        call()
    return got


# --- launch plans ---

def plans_off():
    """Inside (a context manager), no call finds a plan: every call takes the full path (validation, dispatch,
    launcher, Triton's JIT launch), as a first call does."""
    return mock.patch.object(_plans, "lookup", lambda *args: None)


def triton_launcher_only():
    """Inside (a context manager), plans recorded bind Triton's own compiled launcher rather than the direct C
    launch (vflash.ops.direct_launch): what a plan's launch costs without it. Plans recorded before keep theirs."""
    return mock.patch.object(_launches, "direct_launch", lambda *args: None)


clear_plans = _plans.clear  # forget every recorded plan (tiles or tables changed, or a first call to time)
# vflash.attention's key, of its arguments in vflash.call.ATTENTION's order (q, k, v, causal, window, scale,
# softcap, return_lse)
plan_key = _plans.key_function(ATTENTION)
kvcache_plan_key = _plans.key_function(ATTENTION_KVCACHE)  # attention_with_kvcache's, vflash.call's order
lookup_plan = _plans.lookup  # (key): the plan recorded for key that may run now, or None


def recorded_plans() -> list:
    """The plans recorded so far (LaunchPlan: call it with its inputs; .launch, .allocs, .scratch), oldest
    first."""
    return list(_plans._plans.values())


# --- the sm_90 kernels ---

HAVE_GLUON = _gluon.HAVE_GLUON  # whether this Triton has Gluon (the sm_90 kernels need it)
CONSUMER_ROWS = _tiles.CONSUMER_ROWS  # query rows a consumer warpgroup of the forward
CONSUMER_REGS = _tiles.CONSUMER_REGS  # {(consumers, CTAs an SM): registers a consumer thread}: the builds that fit
sm90_grid = _sm90.grid  # (B, Hq, Nq, block_m, sms, right_edge, ctas_per_sm, dynamic): the forward's grid
# (q, k, v, out, lse, counter, band, score, tiles, sms): the forward's launch with these tiles
sm90_launch = _sm90.build
sm90_dq_launch = _sm90_bwd.dq_launch  # the backward's dQ launch with its tiles (block_m, block_n, stages)
sm90_dkdv_launch = _sm90_bwd.dkdv_launch  # the backward's dK / dV launch with its tiles
SM90_BWD_STAGES = _sm90_bwd.STAGES  # the backward's ring depth unless a launch says otherwise

# --- builds without a GPU ---

def compiled_path():
    """Inside, launchers build their launches as for a GPU whatever the tensors' device (no interpreter
    forms, no bf16 done by hand): with capturing_launches, a launcher called on CPU tensors with its tiles
    given then builds the launches a GPU would compile. Nothing may run inside but captured launches, and
    nothing that asks the dispatch (the public API does): it would look for the GPU it chooses for.
    A context manager; the device's properties are an H100's (sm_90, 132 SMs), what the launches compile for."""
    stack = contextlib.ExitStack()
    stack.enter_context(mock.patch.object(_backend, "interpreted", lambda device: False))
    stack.enter_context(mock.patch.object(_backend, "device_properties", lambda index: _SM90_PROPERTIES))
    return stack


_SM90_PROPERTIES = types.SimpleNamespace(major=9, minor=0, multi_processor_count=132)


# (launch): a captured launch compiled for sm_90 without a GPU, from its own arguments (Triton's CompiledKernel)
compile_launch_sm90 = _launches.compile_sm90_launch


def sm90_builds(call: Callable[[], object]) -> list:
    """What `call` compiles to on sm_90, one CompiledKernel a launch, in order: a launcher of @triton.jit
    kernels called on CPU tensors with its tiles given (attention_forward with PortableTiles, say), its
    launches captured on the compiled path (compiled_path, captured_launches), each compiled by
    compile_launch_sm90. A build's PTX is .asm['ptx'], its cubin .asm['cubin']."""
    with compiled_path():
        launches = captured_launches(call)
    return [compile_launch_sm90(launch) for launch in launches]


# (head_dim, dtype, tiles, *, right_edge, left_edge, softcap, lse, varlen, top_left, kv_cache, page_size):
# the Gluon forward compiled for sm_90 without a GPU (Triton's CompiledKernel)
compile_sm90_forward = _sm90.compile_sm90
