"""Bad input raises a clear ValueError/TypeError before anything is launched."""

import math
import os

import pytest
import torch

import vflash


def qkv(B=1, Hq=2, Hkv=2, Nq=8, Nk=8, D=16, dtype=torch.float16, device=None):
    # On the suite's device (VFLASH_TEST_DEVICE): where the CPU cannot run kernels (Triton 3.6's interpreter
    # with numpy >= 2.4 on the GPU machine), CPU tensors are refused before the options are read.
    device = device or os.environ.get("VFLASH_TEST_DEVICE", "cpu")
    return tuple(torch.randn(B, H, N, D, dtype=dtype, device=device) for H, N in ((Hq, Nq), (Hkv, Nk), (Hkv, Nk)))


@pytest.fixture(autouse=True)
def no_launch(monkeypatch):
    # Any launch here would be a validation hole: make it fail loudly.
    import vflash.api
    def boom(*a, **k):
        raise AssertionError("kernel launched despite invalid input")
    monkeypatch.setattr(vflash.api, "attention_forward", boom)


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
    ("window triple", lambda q, k, v: ((q, k, v), dict(window=(1, 2, 3))), TypeError, ["window", "pair"]),
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
