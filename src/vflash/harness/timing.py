"""How the harness and the lab scripts (benchmarks/experiments) time work: one implementation of each
protocol, so that a lab figure and a `vflash bench` figure are measured the same way.

GPU time of a call, milliseconds (`vflash bench`'s protocol):
  time_call               CUDA events around each repetition, the L2 cache flushed before each, after a
                          warm-up: (median, p20, p80, repetitions); the wall clock on the CPU
  time_calls_interleaved  several calls timed in turn, one repetition of each a round, so all see the same clocks
  gemm_warmup             lifts the GPU out of its idle clocks before the first timing
  graphed                 a call as the replay of its CUDA graph: a short call's kernels without its Python path

GPU time of a call, microseconds (the serving sweeps' protocol, `vflash bench --sweep decode`):
  graph_time              calls (one per rotating input copy) captured in one CUDA graph, replayed and timed
  graph_runner, replay_times  its two halves, for scripts that time several runners in turn
  rotating_copies         how many copies of a call's inputs to rotate through so that none is found in L2

Host time, microseconds:
  per_call_us             a call's host work alone: calls queued behind a sleep kernel, median over rounds
  wall_us                 synchronized wall time a call, its kernels included
  cpu_probe_us            a fixed pure-Python loop: how fast the host CPU runs at this moment

summarize: (median, p20, p80, count) of repeated timings, both protocols' statistics.

The serving sweeps (vflash.harness.serving) import their timers from here, so this module imports no other
harness module.
"""

import math
import statistics
import time
from typing import Callable, Dict, List, Sequence, Tuple

import torch

Stats = Tuple[float, float, float, int]  # median, p20, p80, count

# The serving protocol's settings (vflash.harness.serving names them too).
# Replays of a timing's graph before the timed ones, for at least this long: the first ~10 ms of a kernel
# after a row of much larger caches runs about 10 % slow on the H200 (B 128 / KV 1k after B 32 / KV 32k), and
# a row's first method would take that alone.
WARMUP_MS = 50.0
REPLAYS = 20  # timed replays of a graph (a prefill row's method: a round's)
ROTATE_BYTES = 1 << 30  # rotating input copies cover at least this much: no call finds its inputs in L2


def summarize(times: Sequence[float]) -> Stats:
    """(median, p20, p80, count) of repeated timings."""
    times = sorted(times)

    def q(f):
        return times[min(len(times) - 1, int(round(f * (len(times) - 1))))]
    return q(0.5), q(0.2), q(0.8), len(times)


def gemm_warmup(seconds: float = 1.0) -> None:
    """Lift the GPU out of its idle clocks before the first timing."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(10):
            a @ a
        torch.cuda.synchronize()


def time_call(call: Callable[[], object], device: torch.device, rep_ms: float = 200.0,
              warmup_ms: float = 100.0) -> Stats:
    """(median, p20, p80) milliseconds and the repetition count.

    CUDA: events around each call, after warm-up, with the L2 cache flushed in
    between (a 256 MiB write), as triton.testing.do_bench does. CPU: wall clock.
    """
    return time_calls_interleaved([("call", call)], device, rep_ms, warmup_ms)["call"]


def time_calls_interleaved(calls: Sequence[Tuple[str, Callable[[], object]]], device: torch.device,
                           rep_ms: float = 200.0, warmup_ms: float = 1200.0) -> Dict[str, Stats]:
    """{name: (median, p20, p80, repetitions)} in milliseconds for several calls timed in
    turn, one repetition of each per round, so that all of them see the same clocks.

    Under sustained load the H200 holds its power cap and its SM clock moves within
    the first second (a 5-12 % dip about 0.8 s in: docs/performance.md, the power cap),
    so calls timed one after another can meet different clocks. CUDA: every call
    once, three rounds to estimate a round's time, rounds of all of them for
    warmup_ms (past that dip), then rounds with the L2 cache flushed before each
    call and events around it, about rep_ms of each call in all. CPU: wall clock,
    three rounds. time_call is this with one call and a 100 ms warm-up."""
    if device.type != "cuda":
        times = {name: [] for name, _ in calls}
        for _ in range(3):
            for name, call in calls:
                t0 = time.perf_counter()
                call()
                times[name].append((time.perf_counter() - t0) * 1e3)
        return {name: summarize(ts) for name, ts in times.items()}
    flush = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")
    for _, call in calls:
        call()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(3):
        for _, call in calls:
            call()
    end.record()
    end.synchronize()
    round_ms = max(start.elapsed_time(end) / 3, 1e-3)
    for _ in range(max(1, int(warmup_ms / round_ms))):
        for _, call in calls:
            call()
    reps = int(min(1000, max(5, rep_ms * len(calls) / round_ms)))
    events = {name: [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                     for _ in range(reps)] for name, _ in calls}
    for i in range(reps):
        for name, call in calls:
            flush.zero_()
            events[name][i][0].record()
            call()
            events[name][i][1].record()
    torch.cuda.synchronize()
    return {name: summarize([s.elapsed_time(e) for s, e in pairs]) for name, pairs in events.items()}


def graphed(call: Callable[[], object]) -> Callable[[], None]:
    """`call` captured in a CUDA graph, as its replay: one launch's host cost (a few us)
    whatever the call does in Python, so that calls shorter than their Python launch path
    (Triton's JIT launch takes 40-100 us) time their kernels, not the host."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()  # warm-up on a side stream, as graph capture requires
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    return graph.replay


def per_call_us(call: Callable[[], object], n: int = 3000, rounds: int = 10) -> float:
    """Host microseconds a call: the median over `rounds` rounds of n / rounds calls, after
    100 warm-up calls. Each round first stalls the stream with a sleep kernel longer than the
    round, so the calls only queue their kernels: the CPU timer then sees the host's work
    alone, not kernels that a full launch queue would make it wait for (a round of 300 stays
    well inside the queue). CUDA only."""
    for _ in range(100):
        call()
    torch.cuda.synchronize()
    per_round = max(1, n // rounds)
    times = []
    for _ in range(rounds):
        torch.cuda._sleep(200_000_000)  # ~100 ms of GPU clock cycles: longer than any round
        t0 = time.perf_counter()
        for _ in range(per_round):
            call()
        times.append((time.perf_counter() - t0) / per_round * 1e6)
        torch.cuda.synchronize()
    return statistics.median(times)


def graph_runner(calls: Sequence[Callable[[], object]], device: torch.device) -> Callable[[], None]:
    """The calls (one per rotating input copy) run once (compiles, settles the allocator), then captured in one
    CUDA graph: its replay; calls that cannot be captured, a function launching them one after another (timed by
    events all the same). CUDA only."""
    for c in calls:
        c()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            for c in calls:
                c()
        return graph.replay
    except RuntimeError:  # not capturable: the calls launched one after another
        torch.cuda.synchronize()

        def run():
            for c in calls:
                c()
        return run


def replay_times(run: Callable[[], None], n_calls: int, replays: int = REPLAYS,
                 warmup_ms: float = WARMUP_MS) -> List[float]:
    """Microseconds of one call in each of `replays` timed runs of a graph_runner's `run` (n_calls calls each),
    after running it for warmup_ms. CUDA only."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    while (time.perf_counter() - t0) * 1e3 < warmup_ms:
        for _ in range(3):
            run()
        torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / n_calls)
    return times


def graph_time(calls: Sequence[Callable[[], object]], device: torch.device, replays: int = REPLAYS) -> Stats:
    """(median, p20, p80) microseconds of one call and the sample count: the calls (one per rotating input copy,
    so that no call finds its inputs in L2) captured in one CUDA graph (graph_runner), replayed for WARMUP_MS,
    then `replays` times, each timed (replay_times). CPU: the wall clock of one pass, one sample."""
    if device.type != "cuda":
        t0 = time.perf_counter()
        for c in calls:
            c()
        us = (time.perf_counter() - t0) * 1e6 / len(calls)
        return us, us, us, 1
    return summarize(replay_times(graph_runner(calls, device), len(calls), replays, WARMUP_MS))


def rotating_copies(bytes_one: int) -> int:
    """How many copies of inputs of bytes_one bytes the calls of a graph_time rotate through: enough to cover
    ROTATE_BYTES (the L2 cache many times over), at most 64."""
    return max(1, min(64, math.ceil(ROTATE_BYTES / bytes_one)))


def wall_us(call: Callable[[], object], n: int = 50, rounds: int = 5) -> float:
    """A call's wall time on the GPU in microseconds, its kernels included: the least over `rounds` rounds of
    one round's mean, each round n calls synchronized at its end. CUDA only."""
    best = float("inf")
    for _ in range(rounds):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            call()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) * 1e6 / n)
    return best


def cpu_probe_us(n: int = 300) -> float:
    """Mean microseconds of a fixed pure-Python loop that touches neither the driver nor the GPU: the host CPU's
    speed at this moment, to set beside a call's host time (the H200's KVM host has phases of seconds in which
    every CPU cost, this loop's included, runs up to 2x slower)."""
    t0 = time.perf_counter()
    for _ in range(n):
        s = 0
        for i in range(200):
            s += i * i
    return (time.perf_counter() - t0) * 1e6 / n
