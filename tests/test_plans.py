"""Launch plans (the host fast path): keys, recording order, and GPU equivalence."""

import pytest
import torch
import triton

import vflash
from vflash import library
from vflash.call import ATTENTION
from vflash.kernels.attention_fwd import attention_fwd_kernel
from vflash.kernels import attention_fwd_sm90 as sm90_kernels
from vflash.ops import attention as ops
from vflash.ops import launch as launches
from vflash.ops import plans
from vflash.call import Band
from vflash.ops.launch import Alloc, Slot
from vflash.ops.tiles import Sm90Tiles, PortableTiles
from vflash.reference import attention_explicit
from vflash.call import Score


_KEY = plans.key_function(ATTENTION)


def _attention_key(q, k, v, causal, window, scale, softcap, sinks, return_lse, **more):
    # vflash.attention's key of these arguments (the others, by name in `more`, else None: ATTENTION's order)
    given = dict(q=q, k=k, v=v, causal=causal, window=window, scale=scale, softcap=softcap, sinks=sinks,
                 return_lse=return_lse, **more)
    return _KEY(*(given.get(name) for name in ATTENTION.names))


@pytest.fixture
def keyed(monkeypatch):
    # Keys are computed only for compiled kernels; pretend, to test the key itself.
    monkeypatch.setattr(plans, "_planned", lambda q: True)
    q = torch.randn(1, 2, 8, 16)
    return q, lambda causal, scale, window, softcap, return_lse, sinks=None: _attention_key(
        q, q, q, causal, window, scale, softcap, sinks, return_lse)


def test_key_tells_apart_what_validation_tells_apart(keyed):
    q, key = keyed
    base = key(True, None, None, None, False)
    assert base is not None and base == key(True, None, None, None, False)
    # Equal values of refused types never share an accepted value's key.
    assert key(1, None, None, None, False) != base
    assert key(True, None, None, None, 0) != base
    assert key(False, None, (1.0, 2), None, False) != key(False, None, (1, 2), None, False)
    assert key(False, None, [1, 2], None, False) != key(False, None, (1, 2), None, False)
    assert key(False, 1, None, None, False) != key(False, 1.0, None, None, False)
    # Options that change the launch change the key.
    assert key("top_left", None, None, None, False) != base
    assert key(True, None, None, 30.0, False) != base
    assert key(True, None, None, None, True) != base
    sinks = torch.zeros(2)
    assert key(True, None, None, None, False, sinks) != base  # sinks given: a kernel of its own
    assert key(True, None, None, None, False, sinks) == key(True, None, None, None, False, torch.ones(2))
    assert key(True, None, None, None, False, sinks) != key(True, None, None, None, False, torch.zeros(3))
    # FP8's options: an out dtype, a descale given (its shape, not its value)
    q, _ = keyed
    plain = _attention_key(q, q, q, True, None, None, None, None, False)
    assert _attention_key(q, q, q, True, None, None, None, None, False, out_dtype=torch.float16) != plain
    one = _attention_key(q, q, q, True, None, None, None, None, False, q_descale=torch.ones(()))
    assert one != plain and one == _attention_key(q, q, q, True, None, None, None, None, False,
                                                  q_descale=torch.full((), 2.0))
    assert one != _attention_key(q, q, q, True, None, None, None, None, False, q_descale=torch.ones(1, 2))


def test_key_covers_metadata_and_alignment(keyed):
    q, _ = keyed
    args = (False, None, None, None, None, False)
    k = q.clone()
    base = _attention_key(q, k, k, *args)
    assert _attention_key(q, k.transpose(1, 2).contiguous().transpose(1, 2), k, *args) != base  # strides
    assert _attention_key(q, k.half(), k, *args) != base
    shifted = torch.randn(2 * q.numel() + 1)[1:1 + q.numel()].view(q.shape)  # 4-byte offset
    assert _attention_key(shifted, k, k, *args) != base


def test_key_is_none_for_unkeyable_input(keyed):
    q, key = keyed
    assert _attention_key(q.numpy(), q, q, False, None, None, None, None, False) is None
    assert key(False, None, 4, None, False) is None  # window not a pair: the full path raises
    unhashable = key(False, None, ({}, 2), None, False)  # never planned: lookup and record pass it by
    assert plans.lookup(unhashable) is None
    plans.record(unhashable, "plan")
    assert "plan" not in plans._plans.values()


def test_cpu_tensors_never_plan():
    q = torch.randn(1, 1, 4, 16)
    assert _attention_key(q, q, q, False, None, None, None, None, False) is None


def test_recorded_plan_passes_every_parameter_in_signature_order(monkeypatch):
    calls = []

    class FakeCompiled:
        def __getitem__(self, grid):
            calls.append(("grid", grid))
            return lambda *args: calls.append(("launch", args))

    recorded = {}
    monkeypatch.setattr(plans, "record", lambda key, plan: recorded.setdefault(key, plan))
    q = torch.randn(1, 2, 8, 16)
    out = torch.empty_like(q)
    lse = torch.empty(1, 2, 8)
    launch = ops._portable_launch(q, q, q, out, lse, Band(0, -1, 0), Score(0.25), PortableTiles(32, 32, 4, 1))
    allocs = [Alloc("out", (1, 2, 8, 16), q.dtype), Alloc("lse", (1, 2, 8), torch.float32)]
    launches.record("k", launch, FakeCompiled(), ops.INPUTS, allocs, ops.RETURNS, 0)
    plan = recorded["k"]
    assert calls == [("grid", launch.grid)]
    o2, l2 = plan(q, q, q)
    launched = calls[-1][1]
    names = attention_fwd_kernel.arg_names
    assert len(launched) == len(names)
    assert launched[0] is q and launched[3] is o2 and launched[4] is l2
    by_name = dict(zip(names, launched))
    assert by_name["q_strides"][2] == 16 and by_name["n_q"] == 8 and by_name["band"][2] == 0
    assert by_name["scales"][0] == pytest.approx(0.25 * 1.4426950408889634)
    for name, value in launch.constexprs.items():
        assert by_name[name] == value
    assert o2.shape == q.shape and l2.shape == (1, 2, 8) and l2.dtype == torch.float32
    # without LSE the kernel's LSE slot takes out, and the plan returns None for it
    launch = ops._portable_launch(q, q, q, out, None, Band(0, -1, 0), Score(0.25), PortableTiles(32, 32, 4, 1))
    launches.record("k2", launch, FakeCompiled(), ops.INPUTS, allocs[:1], ops.RETURNS, 0)
    o3, l3 = recorded["k2"](q, q, q)
    assert l3 is None and calls[-1][1][4] is o3 is calls[-1][1][3]


def test_recorded_plan_keeps_no_tensor_of_the_recording_call_alive(monkeypatch):
    # a plan rebuilds its slots every call: the recording call's q, k, v, out and lse (a KV cache can be
    # gigabytes) go when the caller drops them
    import gc
    import weakref

    class FakeCompiled:
        def __getitem__(self, grid):
            return lambda *args: None

    recorded = {}
    monkeypatch.setattr(plans, "record", lambda key, plan: recorded.setdefault(key, plan))
    q, k = torch.randn(1, 2, 8, 16), torch.randn(1, 2, 8, 16)
    out, lse = torch.empty_like(q), torch.empty(1, 2, 8)
    launch = ops._portable_launch(q, k, k, out, lse, Band(0, -1, 0), Score(0.25), PortableTiles(32, 32, 4, 1))
    launches.record("k", launch, FakeCompiled(), ops.INPUTS, [Alloc("out", (1, 2, 8, 16), q.dtype),
                                                              Alloc("lse", (1, 2, 8), torch.float32)],
                    ops.RETURNS, 0)
    refs = [weakref.ref(t) for t in (q, k, out, lse)]
    del q, k, out, lse, launch
    gc.collect()
    assert "k" in recorded and not any(r() is not None for r in refs)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="plans record compiled GPU launches")
@pytest.mark.parametrize("n,opts", [(300, dict()), (300, dict(causal=True, return_lse=True)),
                                    (300, dict(window=(64, 0), softcap=20.0)),
                                    (1100, dict(causal=True))])  # Hopper: work tiles drawn from a counter
def test_gpu_planned_calls_match_the_full_path(n, opts):
    plans.clear()
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(2, 8, n, 128, device="cuda", dtype=torch.float16, generator=g) for _ in range(3))
    first = vflash.attention(q, k, v, **opts)
    assert len(plans._plans) == 1
    q2, k2, v2 = (torch.randn_like(q) for _ in range(3))
    second = vflash.attention(q2, k2, v2, **opts)  # planned launch, new data
    assert len(plans._plans) == 1
    if triton.__version__.startswith("3.6."):  # the launcher layout direct_launch knows
        assert next(iter(plans._plans.values())).launch.__name__ == "launch_direct"
    if n == 1100 and torch.cuda.get_device_capability() == (9, 0) and sm90_kernels.HAVE_GLUON:
        # 144 causal work tiles, more than the H200's 132 SMs: drawn from a counter
        assert [a.name for a in next(iter(plans._plans.values())).allocs] == ["out", "tile_counter"]
    q.mul_(0.5)  # same buffers, new data: cached TMA descriptors must still read it
    third = vflash.attention(q, k, v, **opts)
    for got, (qq, kk, vv) in ((first, (q * 2, k, v)), (second, (q2, k2, v2)), (third, (q, k, v))):
        ref = attention_explicit(qq, kk, vv, compute_dtype=torch.float32, **opts)
        got = got if isinstance(got, tuple) else (got,)
        for a, b in zip(got, ref):
            assert torch.isfinite(a).all()
            assert (a.float() - b.float()).abs().max().item() < 2e-2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="plans record compiled GPU launches")
@pytest.mark.parametrize("d", [64, 128])  # 128: the sm90 kernel on sm_90, which needs 16-byte alignment
def test_gpu_misaligned_view_gets_its_own_plan(d):
    plans.clear()
    n = 2 * 4 * 64 * d
    base = torch.randn(n + 8, device="cuda", dtype=torch.float16)
    aligned = base[:n].view(2, 4, 64, d)
    shifted = base[1:1 + n].view(2, 4, 64, d)  # 2-byte offset
    for t in (aligned, shifted, aligned, shifted):
        out = vflash.attention(t, t, t)
        ref, _ = attention_explicit(t, t, t, compute_dtype=torch.float32)
        assert (out.float() - ref.float()).abs().max().item() < 1e-2
    assert len(plans._plans) == 2


class _CudaLauncherLike:
    """Triton 3.6's CudaLauncher layout, as far as direct_launch reads it."""

    def __init__(self, launch, scratch=0):
        self.launch = launch
        self.global_scratch_size = scratch
        self.profile_scratch_size = 0
        self.launch_cooperative_grid = False
        self.launch_pdl = True

    def __call__(self, gridX, gridY, gridZ, stream, function, *args):
        raise AssertionError("direct_launch must call the C function, not the Python launcher")


_CudaLauncherLike.__name__ = "CudaLauncher"


class _Recorder:
    """Stands in for the compiled C function (a callable without __code__)."""

    def __init__(self):
        self.calls = []

    def __call__(self, *args):
        self.calls.append(args)


def _wrap_handle_tensordesc(launcher, tensordesc_meta):
    def inner(*args):
        assert tensordesc_meta  # the real closure reads it too
        return launcher(*args)
    return inner


@pytest.fixture
def triton36(monkeypatch):
    import triton
    monkeypatch.setattr(triton, "__version__", "3.6.0")
    from vflash.ops import direct_launch
    monkeypatch.setattr(direct_launch, "current_raw_stream", lambda device: 1000 + device)


def _compiled(launch, scratch=0):
    from types import SimpleNamespace
    return SimpleNamespace(run=_CudaLauncherLike(launch, scratch), function=77, packed_metadata=(8, 1, 4096))


PTR_SLOTS = [Slot(0, "q"), Slot(1, "k"), Slot(2, "v"), Slot(3, "out"), Slot(4, "lse")]


def test_direct_launch_passes_the_c_launchers_arguments_in_order(triton36):
    from vflash.ops.direct_launch import direct_launch
    c = _Recorder()
    fallback = []
    params = [None] * 5 + [5, 2.5, True]
    launch = direct_launch(_compiled(c), (3, 1, 1), params, PTR_SLOTS, range(5), 2, lambda *a: fallback.append(a))
    q, k, v, out, lse = (torch.randn(4) for _ in range(5))
    launch(q, k, v, out, lse)
    assert not fallback
    assert c.calls == [(3, 1, 1, 1002, 77, False, True, None, None, (8, 1, 4096), None, None, None,
                        q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr(), 5, 2.5, True)]
    # slots anywhere among the parameters, several taking one tensor (no LSE: out in its place)
    c2 = _Recorder()
    params = [9, None, 8, None, None, 7]
    slots = [Slot(1, "q"), Slot(3, "out"), Slot(4, "out")]
    launch = direct_launch(_compiled(c2), (3, 1, 1), params, slots, [0, 1, 1], 0, None)
    launch(q, out)
    assert c2.calls[0][13:] == (9, q.data_ptr(), 8, out.data_ptr(), out.data_ptr(), 7)


def test_direct_launch_leaves_other_layouts_to_triton(triton36, monkeypatch):
    import triton
    from triton import knobs
    from vflash.ops.direct_launch import direct_launch
    params = [None] * 5
    args = ((1, 1, 1), params, PTR_SLOTS, range(5), 0, lambda *a: None)
    assert direct_launch(_compiled(_Recorder(), scratch=64), *args) is None  # needs scratch memory
    assert direct_launch(_compiled(lambda *a: None), *args) is None  # a Python layer, not the C function
    described = [s._replace(describe=lambda t: t) for s in PTR_SLOTS[:4]] + PTR_SLOTS[4:]
    assert direct_launch(_compiled(_Recorder()), (1, 1, 1), params, described, range(5), 0,
                         lambda *a: None) is None  # descriptors where the launcher takes none
    monkeypatch.setattr(triton, "__version__", "3.9.0")
    assert direct_launch(_compiled(_Recorder()), *args) is None
    monkeypatch.setattr(triton, "__version__", "3.6.0")
    c, fallback = _Recorder(), []
    launch = direct_launch(_compiled(c), (1, 1, 1), params, PTR_SLOTS, range(5), 0, lambda *a: fallback.append(a))
    t = torch.zeros(1)
    chain = knobs.runtime.launch_enter_hook  # an empty HookChain in Triton 3.6 and 3.9
    hook = lambda metadata: None  # noqa: E731
    chain.add(hook)  # as a profiler does
    try:
        launch(t, t, t, t, t)  # Triton's own launch runs the hook
    finally:
        chain.remove(hook)
    monkeypatch.setattr(knobs.runtime, "launch_exit_hook", hook)  # a plain function assigned
    launch(t, t, t, t, t)
    assert len(fallback) == 2 and not c.calls
    monkeypatch.undo()
    monkeypatch.setattr(triton, "__version__", "3.6.0")
    launch(t, t, t, t, t)
    assert len(fallback) == 2 and len(c.calls) == 1


def test_direct_launch_encodes_each_descriptor_once_per_pointer(triton36, monkeypatch):
    import triton.backends.nvidia.driver as nvidia
    from vflash.ops.direct_launch import DESCRIPTORS_PER_SLOT, direct_launch
    encoded = []

    def encode(desc, meta):
        encoded.append((desc, meta))
        return [f"map:{desc}", 1, 2]
    monkeypatch.setattr(nvidia, "make_tensordesc_arg", encode)
    c = _Recorder()
    meta = ["mq", "mk", "mv", "mo"]
    describe = lambda t: f"d{t.data_ptr()}"  # noqa: E731
    slots = [s._replace(describe=describe) for s in PTR_SLOTS[:4]] + PTR_SLOTS[4:]
    launch = direct_launch(_compiled(_wrap_handle_tensordesc(c, meta)), (9, 1, 1), [None] * 5 + [7], slots,
                           range(5), 0, None)
    q, k, v, o, o2, lse = (torch.randn(4) for _ in range(6))
    launch(q, k, v, o, lse)
    assert encoded == [(f"d{t.data_ptr()}", m) for t, m in zip((q, k, v, o), meta)]
    assert c.calls[0][13:] == (*[x for t in (q, k, v, o) for x in (f"map:d{t.data_ptr()}", 1, 2)], lse.data_ptr(), 7)
    launch(q, k, v, o2, lse)  # a new output buffer: only its descriptor is encoded
    launch(q, k, v, o, lse)
    assert encoded[4:] == [(f"d{o2.data_ptr()}", "mo")]
    assert c.calls[2] == c.calls[0]
    outs = [torch.randn(4) for _ in range(DESCRIPTORS_PER_SLOT + 1)]
    for t in outs:
        launch(q, k, v, t, lse)
    launch(q, k, v, outs[0], lse)  # the table was cleared when full: re-encoded
    assert encoded[-1] == (f"d{outs[0].data_ptr()}", "mo")


def test_direct_launch_passes_a_counter_after_lse(triton36, monkeypatch):
    import triton.backends.nvidia.driver as nvidia
    from vflash.ops.direct_launch import direct_launch
    monkeypatch.setattr(nvidia, "make_tensordesc_arg", lambda desc, meta: [desc])
    c, fallback = _Recorder(), []
    names = ["dq", "dk", "dv", "do"]
    slots = [Slot(i, n, lambda t, i=i: names[i]) for i, n in enumerate(("q", "k", "v", "out"))]
    slots += [Slot(4, "lse"), Slot(5, "tile_counter")]
    launch = direct_launch(_compiled(_wrap_handle_tensordesc(c, ["m"] * 4)), (9, 1, 1), [None] * 6 + [7], slots,
                           [0, 1, 2, 3, 4, 5], 0, lambda *a: fallback.append(a))
    q, lse, count = torch.randn(4), torch.randn(4), torch.zeros(1, dtype=torch.int32)
    launch(q, q, q, q, lse, count)
    assert c.calls[0][13:] == ("dq", "dk", "dv", "do", lse.data_ptr(), count.data_ptr(), 7) and not fallback


def test_hopper_plan_gives_each_dynamic_launch_a_fresh_counter(monkeypatch):
    # A kernel that draws work tiles from a counter gets a new int32 zero per launch, after
    # LSE. A static one takes None there (a constexpr).
    from vflash.ops import sm90
    if not sm90_kernels.HAVE_GLUON:
        pytest.skip("this Triton has no Gluon")
    launched = []

    class FakeCompiled:
        def __getitem__(self, grid):
            return lambda *args: launched.append(args)

    recorded = {}
    monkeypatch.setattr(plans, "record", lambda key, plan: recorded.setdefault(key, plan))
    names = sm90_kernels.attention_fwd_sm90_kernel.arg_names
    q = torch.randn(1, 2, 300, 128, dtype=torch.float16)
    for dynamic in (False, True):
        counter = torch.zeros(1, dtype=torch.int32) if dynamic else None
        launch = sm90.build(q, q, q, torch.empty_like(q), None, counter, Band(0, -1, 0), Score(0.1, None),
                              Sm90Tiles(128, 128, 2, dynamic=dynamic), 132)
        allocs = [Alloc("out", tuple(q.shape), q.dtype)] + ([Alloc("tile_counter", (1,), torch.int32, True)]
                                                            if dynamic else [])
        launches.record(dynamic, launch, FakeCompiled(), ops.INPUTS, allocs, ops.RETURNS, 0)
        plan = recorded[dynamic]
        for _ in range(2):
            plan(q, q, q)
        first, second = launched[-2:]
        assert len(first) == len(names)
        if dynamic:
            assert first[5].dtype == torch.int32 and first[5].shape == (1,) and not first[5].any()
            assert first[5] is not second[5]
        else:
            assert first[5] is None
        assert dict(zip(names, first))["n_q"] == 300
        assert first[0].base is q and first[3].base is not second[3].base  # each call's own output


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs")
@pytest.mark.parametrize("n", [300, 1100])
def test_gpu_cuda_graph_replays_match_the_oracle(n):
    # A captured call replays with whatever its input buffers hold; on the sm90 kernel
    # (n = 1100, causal) each replay draws its work tiles from a counter zeroed in the graph.
    plans.clear()
    q, k, v = (torch.randn(2, 8, n, 128, device="cuda", dtype=torch.float16) for _ in range(3))
    vflash.attention(q, k, v, causal=True)  # compile and record the plan outside the capture
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        vflash.attention(q, k, v, causal=True)
        with torch.cuda.graph(graph, stream=stream):
            out = vflash.attention(q, k, v, causal=True)
    torch.cuda.current_stream().wait_stream(stream)
    for _ in range(3):
        for t in (q, k, v):
            t.copy_(torch.randn_like(t))
        graph.replay()
        torch.cuda.synchronize()
        ref, _ = attention_explicit(q, k, v, causal=True, compute_dtype=torch.float32)
        assert (out.float() - ref.float()).abs().max().item() < 2e-2


@pytest.fixture
def fake_backward_launches(monkeypatch):
    # ops.attention_backward's launches run as fakes that log (kernel, arguments), and plans are
    # recorded into a dict: (calls, recorded)
    from vflash.ops import attention_bwd as bwd
    calls, recorded = [], {}

    class FakeCompiled:
        def __init__(self, kernel):
            self.kernel = kernel

        def __getitem__(self, grid):
            return lambda *args: calls.append((self.kernel, args))

    monkeypatch.setattr(plans, "record", lambda key, plan: recorded.setdefault(key, plan))
    monkeypatch.setattr(bwd.launches, "run", lambda launch, device: FakeCompiled(launch.kernel))
    return calls, recorded


def test_op_key_covers_metadata_options_and_dlse(monkeypatch):
    monkeypatch.setattr(plans, "_planned", lambda q: True)
    q, lse = torch.randn(1, 2, 8, 16), torch.randn(1, 2, 8)

    backward_key = plans.key_function(library.SPECS["attention_bwd"])
    other_op = plans.key_function(library.SPECS["attention_bwd"]._replace(name="other"))

    def key(do=q, dlse=None, off=0, left=-1, right=0, scale=0.25, softcap=None, sinks=None, op=backward_key):
        return op(do, dlse, q, q, q, q, lse, off, left, right, scale, softcap, sinks, None, None, None)
    base = key()
    assert base is not None and base == key()
    for other in (key(dlse=lse), key(do=q.transpose(2, 3).contiguous().transpose(2, 3)), key(right=-1),
                  key(left=4), key(off=3), key(scale=0.5), key(softcap=30.0), key(scale=1), key(op=other_op),
                  key(sinks=torch.zeros(2))):
        assert other != base
    assert backward_key(q, None, "q", q, q, q, lse, 0, -1, 0, 0.25, None, None, None, None, None) is None


def test_recorded_backward_plan_binds_its_three_launches_to_the_call(fake_backward_launches):
    # the dense backward's plan (what library.attention_bwd replays): delta, dK / dV and dQ launched
    # in order with the new call's tensors in every slot and fresh outputs
    from vflash.dispatch import tables
    from vflash.ops import attention_bwd as bwd
    calls, recorded = fake_backward_launches
    q, k, v, do = (torch.randn(1, 2, 8, 16) for _ in range(4))
    out, lse = torch.randn(1, 2, 8, 16), torch.randn(1, 2, 8)
    bwd.attention_backward(do, q, k, v, out, lse, band=Band(0, -1, 0), score=Score(0.25, None),
                           tiles=tables.BACKWARD_INTERPRETER, plan_key="k")
    assert list(recorded) == ["k"]
    q2, k2, v2, do2, out2 = (torch.randn_like(q) for _ in range(5))
    lse2 = torch.randn_like(lse)
    dq, dk, dv, dsinks = recorded["k"](do2, None, q2, k2, v2, out2, lse2, None)  # no sinks: an empty dsinks
    assert [c[0] for c in calls] == [bwd.attention_bwd_delta_kernel, bwd.attention_bwd_dkdv_kernel,
                                     bwd.attention_bwd_dq_kernel]
    delta_args, dkdv_args, dq_args = (c[1] for c in calls)
    assert delta_args[0] is out2 and delta_args[1] is do2 and delta_args[2] is None
    delta = delta_args[3]
    assert delta.shape == lse.shape and delta.dtype == torch.float32 and dsinks.shape == (0,)
    assert dkdv_args[:8] == (q2, k2, v2, do2, lse2, delta, dk, dv)
    assert dq_args[:7] == (q2, k2, v2, do2, lse2, delta, dq)
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    # inputs the launcher had to convert (a non-fp32 lse) are never planned: the plan would skip the copy
    recorded.clear()
    bwd.attention_backward(do, q, k, v, out, lse.double(), band=Band(0, -1, 0), score=Score(0.25, None),
                           tiles=tables.BACKWARD_INTERPRETER, plan_key="k")
    assert recorded == {}


def test_recorded_varlen_backward_plan_binds_cu_seqlens(fake_backward_launches):
    # packed sequences: the dK / dV and dQ launches take the new call's cu_seqlens too
    from vflash.dispatch import tables
    from vflash.ops import attention_bwd as bwd
    calls, recorded = fake_backward_launches
    q, do, out = (torch.randn(12, 4, 16) for _ in range(3))
    k, v = torch.randn(20, 2, 16), torch.randn(20, 2, 16)
    lse = torch.randn(4, 12)
    cu_q, cu_k = torch.tensor([0, 5, 12], dtype=torch.int32), torch.tensor([0, 9, 20], dtype=torch.int32)
    bwd.attention_backward(do, q, k, v, out, lse, band=Band(0, -1, 0), score=Score(0.25, None),
                           tiles=tables.BACKWARD_INTERPRETER, varlen=(cu_q, cu_k, 7, 11, False), plan_key="kv")
    new = [torch.randn_like(t) for t in (do, q, k, v, out, lse)]
    cu_q2, cu_k2 = torch.tensor([0, 7, 12], dtype=torch.int32), torch.tensor([0, 11, 20], dtype=torch.int32)
    dq, dk, dv, _ = recorded["kv"](new[0], None, *new[1:], cu_q2, cu_k2, None)
    (_, delta_args), (_, dkdv_args), (_, dq_args) = calls
    assert dkdv_args[6] is dk and dkdv_args[7] is dv and dkdv_args[8] is cu_q2 and dkdv_args[9] is cu_k2
    assert dq_args[6] is dq and dq_args[7] is cu_q2 and dq_args[8] is cu_k2
    assert delta_args[0] is new[4] and delta_args[1] is new[0]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="plans record compiled GPU launches")
def test_gpu_planned_varlen_training_matches_the_full_path():
    # attention_varlen's forward and backward ops replay their plans with new lengths in the same shapes
    def grads(seed, lens):
        g = torch.Generator(device="cuda").manual_seed(seed)
        total = sum(lens)
        q, k, v, w = (torch.randn(total, 4, 64, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
        leaves = [t.requires_grad_() for t in (q, k, v)]
        cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
        out = vflash.attention_varlen(*leaves, cu, cu, 600, 600, causal=True)
        return torch.autograd.grad((out.float() * w.float()).sum(), leaves)

    plans.clear()
    first = grads(0, [600, 200, 224])
    assert sorted(key[0] for key in plans._plans) == ["attention_varlen_bwd", "attention_varlen_fwd"]
    again = grads(0, [600, 200, 224])
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    planned = grads(1, [100, 600, 324])  # other lengths, the same totals and longest: the same plans
    assert len(plans._plans) == 2
    plans.clear()
    full = grads(1, [100, 600, 324])
    assert all(torch.equal(a, b) for a, b in zip(planned, full))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="plans record compiled GPU launches")
@pytest.mark.parametrize("n,d,opts", [(1100, 128, dict(causal=True)),  # sm_90 backward on an H200
                                      (300, 64, dict(window=(64, 0), softcap=20.0)),  # portable
                                      (2100, 64, dict(return_lse=True))])  # dlse: the LSE's gradient too
def test_gpu_planned_backward_matches_the_full_path(n, d, opts):
    def grads(seed):
        g = torch.Generator(device="cuda").manual_seed(seed)
        q, k, v, w = (torch.randn(2, 4, n, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
        leaves = [t.requires_grad_() for t in (q, k, v)]
        res = vflash.attention(*leaves, **opts)
        out, lse = res if isinstance(res, tuple) else (res, None)
        loss = (out.float() * w.float()).sum()
        if lse is not None:
            loss = loss + (lse * lse.detach().sin()).sum()
        return torch.autograd.grad(loss, leaves)

    plans.clear()
    first = grads(0)  # the full path, which records the forward's and the backward's plans
    keys = sorted(key[0] for key in plans._plans)
    assert keys == ["attention_bwd", "attention_fwd"]
    again = grads(0)  # the same data through the plan
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    planned = grads(1)  # new data through the plan ...
    plans.clear()
    full = grads(1)  # ... and through the full path
    assert all(torch.equal(a, b) for a, b in zip(planned, full))
    assert sorted(key[0] for key in plans._plans) == keys


def test_plan_allocates_like_its_first_input_only_where_that_is_new_empty():
    # out of q's shape and dtype with q contiguous comes from empty_like(q); a transposed q, a size-1
    # dimension with an odd stride, another dtype or a zero-filled counter keep new_empty / new_zeros,
    # and every allocation has the layout new_empty gives
    seen = []

    def launch(*tensors):
        seen.append(tensors)
    allocs = (Alloc("out", (2, 1, 3, 8), torch.float16), Alloc("lse", (2, 3), torch.float32),
              Alloc("tile_counter", (1,), torch.int32, zero=True))
    cases = [(torch.randn(2, 1, 3, 8).half(), (True, False, False)),
             (torch.randn(2, 8, 3, 1).half().transpose(1, 3), (False, False, False)),
             (torch.randn(2, 3, 3, 8).half()[:, :1], (False, False, False)),  # size-1 dim of stride 24
             (torch.randn(2, 1, 3, 8), (False, False, False))]
    for q, like in cases:
        plan = plans.LaunchPlan(launch, 0, allocs, (1, 2, 3))
        for _ in range(2):
            out, lse, counter = plan(q)
            assert plan.like_first == like
            assert out.shape == (2, 1, 3, 8) and out.dtype == torch.float16 and out.stride() == (24, 24, 8, 1)
            assert lse.shape == (2, 3) and lse.dtype == torch.float32 and lse.is_contiguous()
            assert counter.tolist() == [0]
            assert seen[-1][0] is q and seen[-1][1] is out


def test_every_plan_key_and_custom_op_holds_every_score_option():
    # a call's score options are one value (vflash.call.Score): each field is an argument of every attention
    # entry point's key and of every custom op's schema, so a new option cannot be left out of either
    from vflash.call import ATTENTION_KVCACHE, ATTENTION_VARLEN, Score
    for spec in (ATTENTION, ATTENTION_VARLEN, ATTENTION_KVCACHE, *library.SPECS.values()):
        assert set(Score._fields) <= set(spec.names), spec.name
    for op in (library.attention_fwd, library.attention_bwd, library.attention_varlen_fwd,
               library.attention_varlen_bwd):
        schema = {a.name for a in op._opoverload._schema.arguments}
        assert set(Score._fields) <= schema and set(library.SPECS[op._name].names) == schema


def test_a_key_function_reads_its_spec_in_order(monkeypatch):
    # keys are generated from a spec: each tensor's metadata, each option's type and value, a flag that is not a
    # bool refusing a key; changing any one argument changes the key
    from vflash.call import Spec
    monkeypatch.setattr(plans, "_planned", lambda q: True)
    key = plans.key_function(Spec("toy", (("q", "tensor"), ("extra", "tensor"), ("scale", "option"),
                                         ("window", "pair"), ("check", "flag"))))
    q = torch.randn(2, 3, 4)
    base = key(q, None, 0.5, (1, 2), True)
    assert base[0] == "toy" and base == key(q.clone(), None, 0.5, (1, 2), True)
    for other in (key(q.half(), None, 0.5, (1, 2), True), key(q, q, 0.5, (1, 2), True), key(q, None, 1, (1, 2), True),
                  key(q, None, 0.5, (1, 3), True), key(q, None, 0.5, [1, 2], True), key(q, None, 0.5, (1, 2), False)):
        assert other != base
    assert key(q, None, 0.5, (1, 2), 1) is None  # a flag that is not a bool: the full path decides
    assert key(q.numpy(), None, 0.5, (1, 2), True) is None
    with pytest.raises(TypeError):
        key(q, None, 0.5, (1, 2))  # an argument missing: loud, never a key that forgets it


def test_planned_varlen_repeats_check_their_offsets(interpreted_plans):
    # attention_varlen's repeats take the plan their first call recorded, after the offsets' check the call
    # asked for (the plan's admit): bad offsets still raise, a checked repeat matches the full path
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(12, 2, 16, generator=g).half() for _ in range(3))
    cu = torch.tensor([0, 5, 12], dtype=torch.int32)

    def call(offsets, check=True):
        return vflash.attention_varlen(q, k, v, offsets, offsets, 7, 7, causal=True, check_metadata=check)
    first = call(cu)
    assert [key[0] for key in interpreted_plans._plans] == ["attention_varlen"]
    (plan,) = interpreted_plans._plans.values()
    assert plan.admit is not None
    assert torch.equal(call(cu), first)
    with pytest.raises(ValueError, match="sequence 1 has 9 rows"):
        call(torch.tensor([0, 3, 12], dtype=torch.int32))
    call(cu, check=False)  # unchecked: a plan of its own, admitted without a check
    unchecked = [p for key, p in interpreted_plans._plans.items() if key[-1] is False]
    assert len(unchecked) == 1 and unchecked[0].admit is None
