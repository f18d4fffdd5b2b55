"""Ring attention (vflash.distributed) in 2 and 4 gloo processes on the CPU, through the
interpreter, against the explicit reference (fp64 autograd) on the full sequence: the
forward and LSE shard by shard, and the gradients of q, k and v."""

import os
import socket
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import vflash
from vflash.reference import attention_explicit, attention_varlen_reference
from vflash.distributed import (ring_attention, ring_attention_varlen, shard_sequence, shard_varlen,
                                unshard_sequence, unshard_varlen)
from _devices import needs_interpreter


@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_shard_and_unshard_are_inverse(layout, world):
    x = torch.arange(2 * 3 * 24 * 2).reshape(2, 3, 24, 2)
    shards = [shard_sequence(x, r, world, layout=layout) for r in range(world)]
    assert all(s.shape == (2, 3, 24 // world, 2) for s in shards)
    assert torch.equal(unshard_sequence(shards, layout=layout), x)


def test_zigzag_holds_chunks_r_and_2r_minus_1_minus_r():
    x = torch.arange(8)[None, None, :, None]  # 8 chunks of 1 for R = 4
    assert shard_sequence(x, 1, 4).flatten().tolist() == [1, 6]
    assert shard_sequence(x, 3, 4).flatten().tolist() == [3, 4]
    with pytest.raises(ValueError, match="multiple"):
        shard_sequence(torch.zeros(1, 1, 12, 1), 0, 4)  # 12 rows, 8 chunks
    with pytest.raises(ValueError, match="layout"):
        shard_sequence(x, 0, 4, layout="striped")


@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
def test_shard_and_unshard_varlen_are_inverse(layout):
    cu = torch.tensor([0, 8, 8, 24, 28], dtype=torch.int32)  # lengths 8, 0, 16, 4
    x = torch.arange(28 * 3).reshape(28, 3)
    shards = [shard_varlen(x, cu, r, 2, layout=layout) for r in range(2)]
    assert all(s[1].tolist() == [0, 4, 4, 12, 14] and s[2] == 8 for s in shards)
    assert torch.equal(unshard_varlen([s[0] for s in shards], cu, layout=layout), x)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


CASES = {
    "causal_zigzag": dict(causal=True, layout="zigzag"),
    "noncausal_contiguous": dict(causal=False, layout="contiguous"),
    "window_gqa": dict(causal=True, window=(5, 0), layout="zigzag", hkv=1),
    "window_both_sides": dict(causal=False, window=(3, 4), layout="contiguous", softcap=3.0),
    "longer_kv": dict(causal=True, layout="contiguous", nk_factor=2),
    "sinks_zigzag": dict(causal=True, layout="zigzag", sinks=True),
}


def _worker(rank, world, port, case, out_dir):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        opts = dict(CASES[case])
        layout, hkv, nk_factor = opts.pop("layout"), opts.pop("hkv", 2), opts.pop("nk_factor", 1)
        with_sinks = opts.pop("sinks", False)
        g = torch.Generator().manual_seed(0)
        n = 8 * world  # 8 rows a rank: zigzag chunks of 4
        q = torch.randn(1, 2, n, 16, generator=g)
        k = torch.randn(1, hkv, n * nk_factor, 16, generator=g)
        v = torch.randn(1, hkv, n * nk_factor, 16, generator=g)
        do = torch.randn(1, 2, n, 16, generator=g)
        sinks = torch.randn(2, generator=g) if with_sinks else None
        full = [t.clone().requires_grad_() for t in (q, k, v)]
        full_sinks = sinks.double().requires_grad_() if with_sinks else None
        want, want_lse = attention_explicit(*full, **opts, sinks=full_sinks, compute_dtype=torch.float64)
        want.backward(do.double())
        shard = lambda t: shard_sequence(t, rank, world, layout=layout)  # noqa: E731
        mine = [shard(t).requires_grad_() for t in (q, k, v)]
        my_sinks = sinks.clone().requires_grad_() if with_sinks else None
        runs = []
        for _ in range(2):  # twice: the same bits
            for t in mine + ([my_sinks] if with_sinks else []):
                t.grad = None
            out, lse = ring_attention(*mine, layout=layout, return_lse=True, sinks=my_sinks, **opts)
            out.backward(shard(do))
            runs.append([out.detach()] + [t.grad.clone() for t in mine])
        if with_sinks:  # each rank's share of the sinks' gradient, summed over the ranks
            total = my_sinks.grad.clone()
            dist.all_reduce(total)
            torch.testing.assert_close(total.double(), full_sinks.grad, atol=1e-5, rtol=1e-4)
        for a, b in zip(*runs):
            assert torch.equal(a, b)
        torch.testing.assert_close(lse, shard(want_lse.detach().float()), atol=1e-5, rtol=1e-5)
        got, gq, gk, gv = runs[0]
        for name, a, b in (("out", got, shard(want.detach().float())), ("dq", gq, shard(full[0].grad)),
                           ("dk", gk, shard(full[1].grad)), ("dv", gv, shard(full[2].grad))):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4, msg=f"rank {rank} {name}")
        open(os.path.join(out_dir, f"ok{rank}"), "w").close()
    finally:
        dist.destroy_process_group()


def _varlen_worker(rank, world, port, case, out_dir):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        causal, layout = {"varlen_causal": (True, "zigzag"), "varlen_full": (False, "contiguous")}[case]
        n = 2 * world  # zigzag chunks per sequence
        cu = torch.tensor([0, 4 * n, 4 * n, 7 * n, 8 * n], dtype=torch.int32)  # lengths 4n, 0, 3n, n
        g = torch.Generator().manual_seed(0)
        total = int(cu[-1])
        q, do = torch.randn(total, 2, 16, generator=g), torch.randn(total, 2, 16, generator=g)
        k, v = torch.randn(total, 1, 16, generator=g), torch.randn(total, 1, 16, generator=g)
        sinks = torch.randn(2, generator=g) if causal else None  # the causal case with sinks too
        full = [t.clone().requires_grad_() for t in (q, k, v)]
        full_sinks = sinks.double().requires_grad_() if causal else None
        want, _ = attention_varlen_reference(*full, cu, cu, causal=causal, softcap=4.0, sinks=full_sinks,
                                             compute_dtype=torch.float64)
        want.backward(do.double())
        shard = lambda t: shard_varlen(t, cu, rank, world, layout=layout)[0]  # noqa: E731
        _, cu_local, max_local = shard_varlen(q, cu, rank, world, layout=layout)
        mine = [shard(t).requires_grad_() for t in (q, k, v)]
        my_sinks = sinks.clone().requires_grad_() if causal else None
        out = ring_attention_varlen(*mine, cu_local, max_local, causal=causal, softcap=4.0, sinks=my_sinks,
                                    layout=layout)
        out.backward(shard(do))
        if causal:
            total = my_sinks.grad.clone()
            dist.all_reduce(total)
            torch.testing.assert_close(total.double(), full_sinks.grad, atol=1e-5, rtol=1e-4)
        for name, a, b in (("out", out, shard(want.detach().float())), ("dq", mine[0].grad, shard(full[0].grad)),
                           ("dk", mine[1].grad, shard(full[1].grad)), ("dv", mine[2].grad, shard(full[2].grad))):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4, msg=f"rank {rank} {name}")
        open(os.path.join(out_dir, f"ok{rank}"), "w").close()
    finally:
        dist.destroy_process_group()


# The multi-rank tests run CPU tensors (gloo) through the interpreter, whatever device the
# suite targets: where the interpreter cannot run (Triton 3.6 with numpy 2.4 or later, as on
# the GPU machine), they cannot either. One rank on the suite's device runs below.


def _run(world, case):
    with tempfile.TemporaryDirectory() as d:
        worker = _varlen_worker if case.startswith("varlen") else _worker
        mp.spawn(worker, args=(world, _free_port(), case, d), nprocs=world, join=True)
        assert sorted(os.listdir(d)) == [f"ok{r}" for r in range(world)]


@pytest.mark.slow
@needs_interpreter
@pytest.mark.parametrize("case", list(CASES))
def test_ring_attention_on_two_ranks_matches_one_process(case):
    _run(2, case)


@pytest.mark.slow
@needs_interpreter
@pytest.mark.parametrize("case", ["causal_zigzag", "window_gqa"])
def test_ring_attention_on_four_ranks_matches_one_process(case):
    _run(4, case)


@pytest.mark.slow
@needs_interpreter
@pytest.mark.parametrize("case", ["varlen_causal", "varlen_full"])
def test_ring_attention_varlen_on_two_ranks_matches_one_process(case):
    _run(2, case)


def test_ring_attention_needs_a_process_group():
    q = torch.randn(1, 1, 4, 16)
    with pytest.raises(RuntimeError, match="process group"):
        ring_attention(q, q, q)


def test_ring_attention_on_one_rank_in_this_process(device):
    # world 1 (gloo on the CPU, NCCL on a GPU): the schedule's bands and the kernels on the
    # device at hand, without other processes
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    try:
        # on a GPU, bf16 at D 128 (the sm90 kernel's shapes); the partials are rounded once
        cuda = device.type == "cuda"
        dt, n, d, tol = (torch.bfloat16, 1024, 128, 2e-2) if cuda else (torch.float32, 64, 32, 1e-5)
        g = torch.Generator(device=device).manual_seed(0)
        q = torch.randn(1, 4, n, d, device=device, generator=g).to(dt)
        k = torch.randn(1, 2, n, d, device=device, generator=g).to(dt)
        v = torch.randn(1, 2, n, d, device=device, generator=g).to(dt)
        sinks = torch.randn(4, device=device, generator=g)
        for opts in (dict(causal=True), dict(window=(9, 3)), dict(causal=True, softcap=5.0),
                     dict(causal=True, sinks=sinks)):
            torch.testing.assert_close(ring_attention(q, k, v, **opts), vflash.attention(q, k, v, **opts),
                                       atol=tol, rtol=tol)
        leaves = [t.clone().requires_grad_() for t in (q, k, v, sinks)]
        ring_attention(*leaves[:3], causal=True, sinks=leaves[3]).float().square().sum().backward()
        ref = [t.clone().requires_grad_() for t in (q, k, v, sinks)]
        vflash.attention(*ref[:3], causal=True, sinks=ref[3]).float().square().sum().backward()
        for a, b in zip(leaves, ref):
            torch.testing.assert_close(a.grad, b.grad, atol=tol, rtol=tol)
    finally:
        dist.destroy_process_group()


def test_ring_attention_rejects_bad_input_before_any_transfer(device):
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    try:
        q = torch.randn(1, 2, 6, 16, device=device)
        with pytest.raises(ValueError, match="layout"):
            ring_attention(q, q, q, layout="striped")
        with pytest.raises(ValueError, match="multiples of 2"):
            ring_attention(q[:, :, :5], q[:, :, :5], q[:, :, :5])  # zigzag: two chunks a shard
        with pytest.raises(ValueError):
            ring_attention(q, q[:, :, :, :8], q)  # head dims differ
        packed = torch.randn(6, 2, 16, device=device)
        cu = [torch.tensor(c, dtype=torch.int32, device=device) for c in ([0, 3, 6], [0, 4, 2, 6])]
        with pytest.raises(ValueError, match="multiple of 2"):
            ring_attention_varlen(packed, packed, packed, cu[0], 3)
        with pytest.raises(ValueError):
            ring_attention_varlen(packed, packed, packed, cu[1], 4)
    finally:
        dist.destroy_process_group()


# Several GPUs of one host, one process a GPU over NCCL (issue 26), against single-GPU
# vflash.attention / attention_varlen on the full sequence on the rank's own GPU: bf16 at the
# sm90 kernel's D 128, the forward shard and the gradients, twice for the same bits. NVLink
# multicast stays off in every rank (the machine's rule).
NCCL_CASES = {**CASES, "varlen_causal": dict(causal=True, layout="zigzag"),
              "varlen_full": dict(causal=False, layout="contiguous")}
NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def _nccl_worker(rank, world, port, case, out_dir):
    os.environ.update(NCCL_ENV)
    dev = torch.device("cuda", rank)
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            device_id=dev)
    try:
        opts = dict(NCCL_CASES[case])
        layout, hkv, nk_factor = opts.pop("layout"), opts.pop("hkv", 2), opts.pop("nk_factor", 1)
        g = torch.Generator(device=dev).manual_seed(0)

        def randn(*shape):
            return torch.randn(*shape, device=dev, generator=g).to(torch.bfloat16)
        if case.startswith("varlen"):
            unit = 128 * world  # every length a multiple of the 2R zig-zag chunks
            cu = torch.tensor([0, 8 * unit, 8 * unit, 11 * unit, 12 * unit], dtype=torch.int32, device=dev)
            total = int(cu[-1])
            q, do, k, v = randn(total, 8, 128), randn(total, 8, 128), randn(total, 2, 128), randn(total, 2, 128)
            full = [t.clone().requires_grad_() for t in (q, k, v)]
            want = vflash.attention_varlen(*full, cu, cu, 8 * unit, 8 * unit, **opts)
            shard = lambda t: shard_varlen(t, cu, rank, world, layout=layout)[0]  # noqa: E731
            _, cu_local, max_local = shard_varlen(q, cu, rank, world, layout=layout)

            def ring(*t):
                return ring_attention_varlen(*t, cu_local, max_local, layout=layout, **opts)
        else:
            n = 2048 * world
            q, do = randn(1, 8, n, 128), randn(1, 8, n, 128)
            k, v = randn(1, hkv, n * nk_factor, 128), randn(1, hkv, n * nk_factor, 128)
            full = [t.clone().requires_grad_() for t in (q, k, v)]
            want = vflash.attention(*full, **opts)
            shard = lambda t: shard_sequence(t, rank, world, layout=layout)  # noqa: E731

            def ring(*t):
                return ring_attention(*t, layout=layout, **opts)
        want.backward(do)
        mine = [shard(t).detach().requires_grad_() for t in (q, k, v)]
        runs = []
        for _ in range(2):
            for t in mine:
                t.grad = None
            out = ring(*mine)
            out.backward(shard(do))
            runs.append([out.detach()] + [t.grad.clone() for t in mine])
        for a, b in zip(*runs):
            assert torch.equal(a, b), f"rank {rank}: two runs differ"
        for name, a, b in zip(("out", "dq", "dk", "dv"), runs[0], [want.detach()] + [t.grad for t in full]):
            torch.testing.assert_close(a.float(), shard(b).float(), atol=2e-2, rtol=2e-2, msg=f"rank {rank} {name}")
        open(os.path.join(out_dir, f"ok{rank}"), "w").close()
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 4, 8])
@pytest.mark.parametrize("case", list(NCCL_CASES))
def test_ring_attention_over_nccl_matches_one_gpu(device, world, case):
    if device.type != "cuda" or torch.cuda.device_count() < world:
        pytest.skip(f"needs {world} CUDA GPUs (NCCL); the multi-rank logic runs above on gloo")
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(_nccl_worker, args=(world, _free_port(), case, d), nprocs=world, join=True)
        assert sorted(os.listdir(d)) == [f"ok{r}" for r in range(world)]
