"""Bad input raises a clear ValueError/TypeError before anything is launched."""

import math
import os

import pytest
import torch

import vflash
from vflash.kernels.metadata import sequence_metadata_kernel
from vflash.ops import launch as _launch

# Every kernel launch goes through vflash.ops.launch.run: one reached here would be a validation hole
# (no_launch), except the metadata check's own kernel (its values are checked on their device, before the
# launch they guard) and in the tests that compare numbers (launches).
_REAL_RUN = _launch.run
_DEVICE = os.environ.get("VFLASH_TEST_DEVICE", "cpu")


def qkv(B=1, Hq=2, Hkv=2, Nq=8, Nk=8, D=16, dtype=torch.float16, device=None):
    # On the suite's device (VFLASH_TEST_DEVICE): where the CPU cannot run kernels (Triton 3.6's interpreter
    # with numpy >= 2.4 on the GPU machine), CPU tensors are refused before the options are read.
    device = device or os.environ.get("VFLASH_TEST_DEVICE", "cpu")
    return tuple(torch.randn(B, H, N, D, dtype=dtype, device=device) for H, N in ((Hq, Nq), (Hkv, Nk), (Hkv, Nk)))


def _boom(*a, **k):
    raise AssertionError("kernel launched despite invalid input")


def _checks_only(launch, device):
    if launch.kernel is not sequence_metadata_kernel:
        _boom()
    return _REAL_RUN(launch, device)


@pytest.fixture(autouse=True)
def no_launch(monkeypatch):
    # Any launch but the metadata check's here would be a validation hole: make it fail loudly.
    monkeypatch.setattr(_launch, "run", _checks_only)


@pytest.fixture
def launches(monkeypatch):
    # the real launches back (after no_launch), for a test that compares numbers
    monkeypatch.setattr(_launch, "run", _REAL_RUN)


@pytest.fixture
def cpu():
    # CPU tensors, where this Triton's interpreter runs them
    from vflash._backend import interpreter_refusal
    refusal = interpreter_refusal()
    if refusal is not None:
        pytest.skip(f"CPU tensors do not run here: {refusal}")
    return torch.device("cpu")


CASES = [
    # (description, build args -> (args, kwargs), error type, words the message must contain)
    ("q not a tensor", lambda q, k, v: (([1.0], k, v), {}), TypeError, ["q", "torch.Tensor"]),
    ("v not a tensor", lambda q, k, v: ((q, k, None), {}), TypeError, ["v", "torch.Tensor"]),
    ("rank 3", lambda q, k, v: ((q[0], k, v), {}), ValueError, ["q", "4-D", "transpose"]),
    ("int dtype", lambda q, k, v: ((q.int(), k, v), {}), TypeError, ["q", "dtype", "float16"]),
    ("fp64", lambda q, k, v: ((q.double(), k.double(), v.double()), {}), TypeError, ["float64"]),
    ("mixed dtypes", lambda q, k, v: ((q, k.bfloat16(), v), {}), TypeError, ["share one dtype", "bfloat16"]),
    ("k/v shape", lambda q, k, v: ((q, k, v[:, :, :4]), {}), ValueError, ["k and v", "same shape"]),
    ("batch", lambda q, k, v: ((q, torch.cat([k, k]), torch.cat([v, v])), {}), ValueError, ["batch", "1", "2"]),
    ("heads", lambda q, k, v: ((torch.cat([q, q[:, :1]], 1), k, v), {}), ValueError, ["multiple", "3", "2"]),
    ("head dim mismatch", lambda q, k, v: ((q, k[..., :8], v[..., :8]), {}), ValueError, ["head dims", "16", "8"]),
    ("head dim not multiple of 8", lambda q, k, v: ((q[..., :12], k[..., :12], v[..., :12]), {}), ValueError,
     ["multiple of 8", "12"]),
    ("head dim too big", lambda q, k, v: ((torch.randn(1, 2, 4, 264).half(),) * 3, {}), ValueError, ["264"]),
    ("batch over grid limit", lambda q, k, v: ((torch.randn(65536, 1, 1, 8).half(),) * 3, {}),
     ValueError, ["65536", "65535", "chunks of at most 65535"]),
    ("q heads over grid limit", lambda q, k, v: ((torch.randn(1, 65536, 1, 8).half(),
                                                  torch.randn(1, 1, 1, 8).half(), torch.randn(1, 1, 1, 8).half()), {}),
     ValueError, ["65536", "65535", "q heads"]),
    ("causal int", lambda q, k, v: ((q, k, v), dict(causal=1)), TypeError, ["causal", "int"]),
    ("causal word", lambda q, k, v: ((q, k, v), dict(causal="upper")), ValueError, ["causal", "upper", "top_left"]),
    ("window scalar", lambda q, k, v: ((q, k, v), dict(window=4)), TypeError, ["window", "pair"]),
    ("window triple", lambda q, k, v: ((q, k, v), dict(window=(1, 2, 3))), ValueError, ["window", "pair"]),
    ("window float", lambda q, k, v: ((q, k, v), dict(window=(1.5, 2))), TypeError, ["window left", "int"]),
    ("window < -1", lambda q, k, v: ((q, k, v), dict(window=(4, -2))), ValueError, ["window right", "-2"]),
    ("softcap 0", lambda q, k, v: ((q, k, v), dict(softcap=0.0)), ValueError, ["softcap", "> 0"]),
    ("softcap negative", lambda q, k, v: ((q, k, v), dict(softcap=-3)), ValueError, ["softcap"]),
    ("softcap str", lambda q, k, v: ((q, k, v), dict(softcap="5")), TypeError, ["softcap"]),
    ("scale nan", lambda q, k, v: ((q, k, v), dict(scale=math.nan)), ValueError, ["scale", "finite"]),
    ("scale inf", lambda q, k, v: ((q, k, v), dict(scale=math.inf)), ValueError, ["scale"]),
    ("scale 0", lambda q, k, v: ((q, k, v), dict(scale=0.0)), ValueError, ["scale", "> 0"]),
    ("scale negative", lambda q, k, v: ((q, k, v), dict(scale=-0.1)), ValueError, ["scale"]),
    ("scale bool", lambda q, k, v: ((q, k, v), dict(scale=True)), TypeError, ["scale"]),
    ("return_lse int", lambda q, k, v: ((q, k, v), dict(return_lse=1)), TypeError, ["return_lse", "bool"]),
]


@pytest.mark.parametrize("desc,build,err,words", CASES, ids=[c[0] for c in CASES])
def test_validation_errors(desc, build, err, words):
    args, kwargs = build(*qkv())
    with pytest.raises(err) as info:
        vflash.attention(*args, **kwargs)
    msg = str(info.value)
    for w in words:
        assert w in msg, f"{desc}: {w!r} not in {msg!r}"


def test_requires_grad_is_refused_by_the_entry_points_without_a_backward():
    q, k, v = (t.transpose(1, 2).contiguous() for t in qkv())  # [B, N, H, D]: decode queries, a contiguous cache
    q.requires_grad_(True)
    with pytest.raises(ValueError, match="vflash.attention_with_kvcache has no backward pass yet"):
        vflash.attention_with_kvcache(q, k, v, torch.tensor([8], dtype=torch.int32, device=q.device))


def test_device_mismatch():
    q, k, v = qkv()
    meta = torch.empty(k.shape, dtype=k.dtype, device="meta")
    with pytest.raises(ValueError, match="one device"):
        vflash.attention(q, meta, v)


def test_cpu_tensors_where_the_interpreter_cannot_run_say_why(monkeypatch):
    # (Triton 3.6's interpreter with numpy >= 2.4): refused before any launch, saying how to fix it
    import vflash._validate as val
    monkeypatch.setattr(val, "interpreter_refusal", lambda: "Triton 3.6.0's interpreter does not run with numpy "
                        "2.4.6: install numpy<2.4 or a newer Triton to run CPU tensors")
    with pytest.raises(ValueError, match="q is a CPU tensor, and .*numpy<2.4"):
        vflash.attention(*qkv(device="cpu"))


def test_messages_do_not_print_tensor_contents():
    q, k, v = qkv()
    with pytest.raises(TypeError) as info:
        vflash.attention(q, k.bfloat16(), v)
    assert "tensor([" not in str(info.value)


@pytest.mark.parametrize("name,bad,words", [
    ("list", [[1.0] * 1000] * 169, ["q", "list of length 169", "torch.tensor(x)"]),
    ("numpy", "numpy", ["q", "numpy.ndarray", "(169, 1000)", "torch.from_numpy(x)"]),
])
def test_non_tensor_input_is_named_not_printed(name, bad, words):
    if bad == "numpy":
        np = pytest.importorskip("numpy")
        bad = np.full((169, 1000), 1.0)
    _, k, v = qkv()
    with pytest.raises(TypeError) as info:
        vflash.attention(bad, k, v)
    msg = str(info.value)
    for w in words:
        assert w in msg, msg
    assert "1.0" not in msg and len(msg) < 200, msg


@pytest.mark.parametrize("kwargs,words", [
    (dict(causal="x" * 10_000), ["causal", "str", "..."]),
    (dict(causal=[True] * 10_000), ["causal", "list of length 10000"]),
    (dict(window=list(range(10_000))), ["window", "list of length 10000"]),
    (dict(window=(10**5000, 0)), ["window left", "too large"]),  # str() of this int raises in Python
    (dict(window=(-10**5000, 0)), ["window left", ">= 0"]),
    (dict(scale=torch.full((100, 100), 0.123)), ["scale", "shape=(100, 100)"]),
    (dict(softcap="9" * 10_000), ["softcap", "str"]),
    (dict(return_lse=[1] * 10_000), ["return_lse", "list of length 10000"]),
], ids=["long causal str", "causal list", "window list", "window huge", "window huge negative",
        "scale tensor", "softcap long str", "return_lse list"])
def test_option_messages_stay_short(kwargs, words):
    with pytest.raises((TypeError, ValueError)) as info:
        vflash.attention(*qkv(), **kwargs)
    msg = str(info.value)
    for w in words:
        assert w in msg, msg
    assert len(msg) < 200 and "0.123" not in msg and "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx" not in msg, msg


# --- attention_with_kvcache's layout: FlashAttention's q [B, Nq, Hq, D], not attention's [B, Hq, Nq, D] ---


def _cache(B=2, rows=8, Hkv=1, D=16, device=_DEVICE, seed=0):
    g = torch.Generator().manual_seed(seed)
    k_cache, v_cache = (torch.randn(B, rows, Hkv, D, generator=g).half().to(device) for _ in range(2))
    return k_cache, v_cache, torch.tensor([5, 8][:B], dtype=torch.int32, device=device)


@pytest.mark.parametrize("check", [True, False])
@pytest.mark.parametrize("paged", [False, True])
def test_attention_layout_decode_query_against_a_one_head_cache_is_refused(monkeypatch, check, paged):
    # q [B, 32, 1, D] is 32 new queries of one head or attention's decode query of 32 heads: MQA would run
    # either, so it is refused before any launch (the metadata check's kernel included), naming the fix
    monkeypatch.setattr(_launch, "run", _boom)
    k_cache, v_cache, lens = _cache()
    table = torch.arange(2, dtype=torch.int32, device=lens.device)[:, None] if paged else None
    q = torch.randn(2, 32, 1, 16, dtype=torch.float16, device=lens.device)
    with pytest.raises(ValueError) as info:
        vflash.attention_with_kvcache(q, k_cache, v_cache, lens, block_table=table, check_metadata=check)
    msg = str(info.value)
    for words in ("q (2, 32, 1, 16)", "[B, Nq, Hq, D]", "[B, Hq, Nq, D]", "q.transpose(1, 2)", "docs/layouts.md",
                  "[total_q, 1, D] with cu_seqlens_q"):
        assert words in msg, msg
    # the transpose is a decode query of 32 heads, which passes every check (and reaches the launch)
    with pytest.raises(AssertionError, match="kernel launched"):
        vflash.attention_with_kvcache(q.transpose(1, 2), k_cache, v_cache, lens, block_table=table,
                                      check_metadata=False)


def test_one_head_decode_query_is_not_ambiguous():
    # q [B, 1, 1, D] reads alike in both layouts: accepted
    k_cache, v_cache, lens = _cache()
    with pytest.raises(AssertionError, match="kernel launched"):
        vflash.attention_with_kvcache(torch.randn(2, 1, 1, 16, dtype=torch.float16, device=lens.device),
                                      k_cache, v_cache, lens)


def test_gqa_heads_in_the_wrong_layout_name_the_transpose():
    k_cache, v_cache, lens = _cache(Hkv=8)
    with pytest.raises(ValueError) as info:  # decode q [B, Hq = 32, 1, D]: 1 head read, not a multiple of 8
        vflash.attention_with_kvcache(torch.randn(2, 32, 1, 16, dtype=torch.float16, device=lens.device),
                                      k_cache, v_cache, lens)
    msg = str(info.value)
    for words in ("q heads (1, q.shape[2]) must be a multiple of k/v heads (8)", "q.shape[1] (32)",
                  "[B, Nq, Hq, D]", "q.transpose(1, 2)"):
        assert words in msg, msg
    with pytest.raises(ValueError) as info:  # heads that fit neither layout: no transpose to suggest
        vflash.attention_with_kvcache(torch.randn(2, 1, 12, 16, dtype=torch.float16, device=lens.device),
                                      k_cache, v_cache, lens)
    assert "multiple of k/v heads (8)" in str(info.value) and "transpose" not in str(info.value)


def test_one_head_model_passes_its_queries_packed(launches):
    # a one-head model's chunked prefill, packed [total_q, 1, D]: each sequence's rows as vflash.attention gives
    # them for its dense [1, 1, Nq, D] queries against its cached keys (bottom-right causal)
    k_cache, v_cache, lens = _cache(rows=8, Hkv=1)
    g = torch.Generator().manual_seed(1)
    lens_q = [3, 2]
    q = torch.randn(sum(lens_q), 1, 16, generator=g).half().to(lens.device)
    cu = torch.tensor([0, 3, 5], dtype=torch.int32, device=lens.device)
    out, lse = vflash.attention_with_kvcache(q, k_cache, v_cache, lens, cu_seqlens_q=cu, max_seqlen_q=3,
                                             return_lse=True)
    assert out.shape == q.shape and lse.shape == (1, 5)
    for b, (start, n) in enumerate(zip([0, 3], lens_q)):
        keys, values = (c[b:b + 1, :int(lens[b])].transpose(1, 2) for c in (k_cache, v_cache))  # [1, 1, Nk, D]
        want, want_lse = vflash.attention(q[start:start + n].transpose(0, 1)[None], keys, values, causal=True,
                                          return_lse=True)
        assert (out[start:start + n].transpose(0, 1).float() - want[0].float()).abs().max().item() < 2e-3
        assert (lse[:, start:start + n] - want_lse[0]).abs().max().item() < 1e-4


# --- check_metadata=False on CPU tensors: checked anyway (an unchecked bad page id would crash the process) ---


def _paged_args(device):
    k_cache, v_cache, _ = _cache(B=2, rows=4, Hkv=2, device=device)  # 2 pages of 4 rows
    return dict(q=torch.randn(2, 1, 4, 16, dtype=torch.float16, device=device), k_cache=k_cache, v_cache=v_cache,
                cache_seqlens=torch.tensor([4, 3], dtype=torch.int32, device=device),
                block_table=torch.tensor([[1], [0]], dtype=torch.int32, device=device))


@pytest.mark.parametrize("change,match", [
    (lambda a: dict(block_table=a["block_table"] + 10**6), r"block_table\[0, 0\] = 1000001 is not a page"),
    (lambda a: dict(block_table=a["block_table"] - 10**6), r"block_table\[0, 0\] = -999999 is not a page"),
    (lambda a: dict(cache_seqlens=torch.tensor([4, 10**6], dtype=torch.int32)), r"cache_seqlens\[1\] = 1000000"),
    (lambda a: dict(cache_seqlens=torch.tensor([-5, 3], dtype=torch.int32)), r"cache_seqlens\[0\] = -5"),
    (lambda a: dict(q=a["q"][:, 0], cu_seqlens_q=torch.tensor([0, 10**6, 2], dtype=torch.int32), max_seqlen_q=1),
     "non-decreasing|more than max_seqlen_q"),
], ids=["page past the cache", "negative page", "length past the table", "negative length", "cu_seqlens_q"])
def test_unchecked_kvcache_metadata_on_cpu_is_checked_anyway(cpu, change, match):
    args = _paged_args(cpu)
    args.update(change(args))
    with pytest.raises(ValueError, match=match):
        vflash.attention_with_kvcache(**args, check_metadata=False)


def test_unchecked_varlen_offsets_on_cpu_are_checked_anyway(cpu):
    q, k, v = (torch.randn(7, 2, 16, dtype=torch.float16) for _ in range(3))
    good = torch.tensor([0, 3, 7], dtype=torch.int32)
    for bad, match in (([0, 3, 10**6], r"cu_seqlens_k\[-1\] must be the packed length"),
                       ([0, -10**6, 7], "non-decreasing")):
        with pytest.raises(ValueError, match=match):
            vflash.attention_varlen(q, k, v, good, torch.tensor(bad, dtype=torch.int32), 4, 10**6,
                                    check_metadata=False)


def test_unchecked_slots_on_cpu_are_checked_anyway(cpu):
    k_cache, v_cache, _ = _cache(B=2, rows=4, Hkv=2, device=cpu)
    new = torch.randn(2, 2, 16, dtype=torch.float16)
    for slots, match in (([0, 8], r"slot_mapping\[1\] = 8 is outside"), ([3, 3], "repeats")):
        with pytest.raises(ValueError, match=match):
            vflash.write_kvcache(k_cache, v_cache, new, new, torch.tensor(slots), check_metadata=False)


# --- write_kvcache refuses destinations that alias, as Tensor.copy_ does ---


def _write_args(device=_DEVICE):
    k_cache, v_cache, _ = _cache(B=4, rows=8, Hkv=2, device=device)
    new = torch.randn(2, 2, 16, dtype=torch.float16, device=device)
    return dict(k_cache=k_cache, v_cache=v_cache, k_new=new, v_new=new,
                slot_mapping=torch.tensor([0, 9], device=device))


def _overlapping_pages(c):
    # pages 8 rows long that start a row apart: page p's row r is page p + 1's row r - 1
    return c.as_strided(c.shape, (c.stride(1), c.stride(1), c.stride(2), c.stride(3)))


@pytest.mark.parametrize("change,match", [
    (lambda a: dict(k_cache=a["k_cache"][:1].expand(4, 8, 2, 16)), r"k_cache's slots overlap each other"),
    (lambda a: dict(v_cache=a["v_cache"][:, :1].expand(4, 8, 2, 16)), r"v_cache's slots overlap each other"),
    (lambda a: dict(k_cache=a["k_cache"][..., :1, :].expand(4, 8, 2, 16)), r"k_cache's slots overlap each other"),
    (lambda a: dict(k_cache=_overlapping_pages(a["k_cache"])), r"k_cache's slots overlap each other"),
    (lambda a: dict(v_cache=a["k_cache"]), "k_cache and v_cache share memory"),
    (lambda a: dict(v_cache=a["k_cache"].view(-1)[256:].view(-1)[:a["k_cache"].numel() - 256]
                    .view(a["k_cache"].shape[0] - 1, *a["k_cache"].shape[1:]),
                    k_cache=a["k_cache"][:3]), "k_cache and v_cache share memory"),
], ids=["expanded pages", "expanded rows", "expanded heads", "as_strided pages", "one cache twice",
        "caches a page apart"])
def test_write_kvcache_refuses_aliased_caches(change, match):
    args = _write_args()
    args.update(change(args))
    with pytest.raises(ValueError, match=match):
        vflash.write_kvcache(**args)


@pytest.mark.parametrize("layout", ["[pages, 2, ...]", "[2, pages, ...]"])
def test_write_kvcache_takes_two_disjoint_slices_of_one_buffer(layout):
    # FlashInfer's cache [pages, 2, page_size, H, D] interleaves K and V pages (their byte extents overlap, their
    # elements do not), vLLM's stacks them: both pass the checks, to the launch
    args = _write_args()
    kv = torch.zeros(4, 2, 8, 2, 16, dtype=torch.float16, device=args["k_new"].device)
    if layout != "[pages, 2, ...]":
        kv = torch.zeros(2, 4, 8, 2, 16, dtype=torch.float16, device=args["k_new"].device).transpose(0, 1)
    args.update(k_cache=kv[:, 0], v_cache=kv[:, 1])
    with pytest.raises(AssertionError, match="kernel launched"):
        vflash.write_kvcache(**args)


# --- a bad value of the right type is a ValueError, a wrong type a TypeError ---


def _varlen_args():
    q, k, v = (torch.randn(7, 2, 16, dtype=torch.float16, device=_DEVICE) for _ in range(3))
    cu = torch.tensor([0, 3, 7], dtype=torch.int32, device=_DEVICE)
    return dict(q=q, k=k, v=v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=4, max_seqlen_k=4)


def _packed_kvcache_args():
    k_cache, v_cache, lens = _cache(Hkv=2)
    return dict(q=torch.randn(2, 4, 16, dtype=torch.float16, device=_DEVICE), k_cache=k_cache, v_cache=v_cache,
                cache_seqlens=lens, cu_seqlens_q=torch.tensor([0, 1, 2], dtype=torch.int32, device=_DEVICE),
                max_seqlen_q=1)


@pytest.mark.parametrize("call,change,err,match", [
    ("varlen", dict(max_seqlen_q=-1), ValueError, "max_seqlen_q must be an int >= 0, got int -1"),
    ("varlen", dict(max_seqlen_k=-(10**5000)), ValueError, "max_seqlen_k must be an int >= 0, got int <int of"),
    ("varlen", dict(max_seqlen_k=True), TypeError, "max_seqlen_k must be an int >= 0, got bool"),
    ("varlen", dict(max_seqlen_q=4.0), TypeError, "max_seqlen_q must be an int >= 0, got float"),
    ("kvcache", dict(max_seqlen_q=-1), ValueError, "max_seqlen_q must be an int >= 0 with cu_seqlens_q, got int -1"),
    ("kvcache", dict(max_seqlen_q=None), TypeError, "max_seqlen_q must be an int >= 0 with cu_seqlens_q"),
    ("kvcache", dict(num_splits=0), ValueError, "num_splits must be None or an int >= 1, got int 0"),
    ("kvcache", dict(num_splits=-3), ValueError, "num_splits must be None or an int >= 1, got int -3"),
    ("kvcache", dict(num_splits=True), TypeError, "num_splits must be None or an int >= 1, got bool"),
    ("kvcache", dict(num_splits=2.0), TypeError, "num_splits must be None or an int >= 1, got float"),
    ("kvcache", dict(cache_seqlens=torch.tensor([[5, 8]], dtype=torch.int32, device=_DEVICE)), ValueError,
     r"cache_seqlens must be an int32 tensor \[batch\], got tensor\(shape=\(1, 2\)"),
    ("kvcache", dict(cache_seqlens=[5, 8]), TypeError, r"cache_seqlens must be an int32 tensor .*torch.tensor\(x\)"),
    ("kvcache", dict(block_table=torch.tensor([0, 1], dtype=torch.int32, device=_DEVICE)), ValueError,
     r"block_table must be an int32 tensor \[batch, max_pages\]"),
    ("kvcache", dict(cu_seqlens_q=torch.tensor([[0, 1, 2]], dtype=torch.int32, device=_DEVICE)), ValueError,
     r"cu_seqlens_q must be an int32 tensor \[batch \+ 1\]"),
    ("write", dict(slot_mapping=torch.tensor([[0, 9]], device=_DEVICE)), ValueError,
     "slot_mapping must be a 1-D int32 or int64 tensor"),
    ("write", dict(slot_mapping=torch.tensor([0.0, 9.0], device=_DEVICE)), TypeError,
     "slot_mapping must be a 1-D int32 or int64 tensor"),
])
def test_bad_values_are_value_errors_and_wrong_types_type_errors(call, change, err, match):
    entry, args = {"varlen": (vflash.attention_varlen, _varlen_args), "write": (vflash.write_kvcache, _write_args),
                   "kvcache": (vflash.attention_with_kvcache, _packed_kvcache_args)}[call]
    args = args()
    args.update(change)
    with pytest.raises(err, match=match) as info:
        entry(**args)
    assert len(str(info.value)) < 200


# --- dtype messages name each tensor ---


def test_write_kvcache_dtype_message_names_each_tensor():
    args = _write_args()
    args.update(k_new=args["k_new"].float(), v_new=args["v_new"].bfloat16())
    with pytest.raises(TypeError) as info:
        vflash.write_kvcache(**args)
    msg = str(info.value)
    assert ("share one of float16, bfloat16, float32, got k_cache torch.float16, v_cache torch.float16, "
            "k_new torch.float32, v_new torch.bfloat16") in msg, msg


def test_merge_states_dtype_message_names_each_tensor():
    out, lse = torch.zeros(2, 3, 16, device=_DEVICE), torch.zeros(2, 3, device=_DEVICE)
    with pytest.raises(TypeError, match="share one of float16, bfloat16, float32, got out_a torch.float32, "
                                        "out_b torch.float16"):
        vflash.merge_states(out, lse, out.half(), lse)
