"""The live lab scripts import and parse their options on the CPU, share one module
without sys.path edits, reach the library through the public names of its public modules alone
(its internals through vflash.harness.lab), and still fit the library's launcher API."""

import ast
import importlib
import os
import re
import subprocess
import sys
import types

import pytest
import torch

from benchmarks.experiments import common, sm90_variants, profile_sm90
from vflash.dispatch import tables
from vflash.harness import lab
from vflash.harness.lab import Sm90Tiles, mask_band

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
WITH_OPTIONS = ["ab_trees", "clock_ramp", "sm90_variants", "profile_sm90", "ncu_summary", "sass_schedule",
                "ptx_fingerprint", "decode_warp_keys", "host_noise", "chunked_ring", "kvops_tune", "invariant_tune",
                "ring_scaling", "check_cost", "bwd_host", "bwd_sm90", "bwd_tune", "decode_host", "decode_residency",
                "decode_tune", "decode_trees", "profile_decode", "ring_single_gpu", "sm90_compile", "hf_gpt_oss",
                "mla_decode", "vhead_prefill"]
WITHOUT_OPTIONS = ["host_sm90", "launch_overhead"]
# The library's modules a lab script may import: the public API and what vflash.harness.lab collects.
PUBLIC = re.compile(r"vflash(\.(harness|dispatch|reference|integrations)(\.\w+)*|\.distributed|\.cli)?")
needs_gluon = pytest.mark.skipif(not lab.HAVE_GLUON, reason="this Triton has no Gluon")


def _run(*args):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "src"), ROOT]))
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=300)


@pytest.mark.parametrize("module", [f"benchmarks.experiments.{m}" for m in WITH_OPTIONS] + ["benchmarks.tune"])
def test_script_parses_help_as_a_module(module):
    r = _run(module, "--help")
    assert r.returncode == 0 and r.stdout.startswith("usage:"), r.stdout + r.stderr


@pytest.mark.parametrize("name", WITHOUT_OPTIONS)
def test_gpu_only_script_imports_and_returns_early_without_cuda(name, capsys):
    module = importlib.import_module(f"benchmarks.experiments.{name}")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the script would measure")
    assert module.main() == 1 and "needs a CUDA device" in capsys.readouterr().err


def test_no_sys_path_edits_and_the_library_suite_imports_no_lab_script():
    for folder, _, files in os.walk(os.path.join(ROOT, "benchmarks")):
        for f in files:
            if f.endswith(".py"):
                text = open(os.path.join(folder, f)).read()
                assert not re.search(r"sys\.path\.(insert|append)", text), os.path.join(folder, f)
    tests = os.path.join(ROOT, "tests")
    for f in os.listdir(tests):
        if f.endswith(".py"):
            text = open(os.path.join(tests, f)).read()
            assert not re.search(r"benchmarks[./]experiments|\bimport launch_overhead\b", text), \
                f"tests/{f} refers to the lab scripts"


def _lab_sources():
    # (path, syntax tree) of every Python file under benchmarks/ but the results
    for folder, _, files in os.walk(os.path.join(ROOT, "benchmarks")):
        if os.path.basename(folder) == "results":
            continue
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(folder, f)
                yield os.path.relpath(path, ROOT), ast.parse(open(path).read())


def _private(name):
    return name.startswith("_") and not name.startswith("__")  # __version__, __file__: public


def test_lab_scripts_import_only_public_modules_of_the_library():
    seen = 0
    for path, tree in _lab_sources():
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
            for name in names:
                if name.split(".")[0] == "vflash":
                    seen += 1
                    assert PUBLIC.fullmatch(name), f"{path} imports {name}"
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "vflash":
                private = [a.name for a in node.names if _private(a.name)]
                assert not private, f"{path} imports private {private} from {node.module}"
    assert seen > 20


def _vflash_modules(tree):
    # {local name: module} for each name the file binds to one of the library's modules, wherever it is bound
    # (a lazy import inside a function included)
    bound = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "vflash":
                    bound[a.asname or "vflash"] = importlib.import_module(a.name if a.asname else "vflash")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "vflash":
            for a in node.names:
                try:
                    obj = importlib.import_module(f"{node.module}.{a.name}")
                except ImportError:
                    continue  # a name defined in the module: a function, a class, a constant
                bound[a.asname or a.name] = obj
    return bound


def test_lab_scripts_use_no_private_name_of_the_library():
    # module._name on one of the library's modules (serving._prefill_rows, vflash.distributed._Ring) is an
    # internal the lab should reach through a public name: a refactor would break the script unseen.
    # Private names of other objects (a named tuple's _replace) are not the library's modules' and pass.
    for path, tree in _lab_sources():
        modules = _vflash_modules(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute):
                continue
            chain, value = [node.attr], node.value
            while isinstance(value, ast.Attribute):
                chain.insert(0, value.attr)
                value = value.value
            if not isinstance(value, ast.Name) or value.id not in modules:
                continue
            obj = modules[value.id]
            for attr in chain:  # follow the modules; a private name on one of them is refused
                if not isinstance(obj, types.ModuleType):
                    break
                assert not _private(attr), f"{path}:{node.lineno} uses {value.id}.{'.'.join(chain)}"
                obj = getattr(obj, attr, None)


def test_lab_surface_resolves_every_name_it_lists():
    assert all(getattr(lab, name, None) is not None for name in lab.__all__)
    assert set(lab.__all__) <= set(lab.__doc__.replace(",", " ").split())


def test_sweep_shapes_and_inputs():
    s = common.sweep_shape(128, 4096, True)
    assert (s.B, s.Hq, s.Nq, s.D, s.causal) == (4, 16, 4096, 128, True)
    assert common.sweep_shape(128, 4097, False) is None
    assert [x.D for x in common.parse_sweep_shapes("128:512:c,64:16384")] == [128, 64]
    with pytest.raises(ValueError, match="12:34"):
        common.parse_sweep_shapes("12:34")
    q, k, v = common.make(2, 4, 2, 8, 16, 32, torch.float16, "bshd", device="cpu")
    assert q.shape == (2, 4, 8, 32) and k.shape == v.shape == (2, 2, 16, 32) and q.stride(1) == 32
    assert all(case[5] in {d for d, _ in tables.SM90} for case in common.CASES)


@pytest.mark.parametrize("d", sorted(sm90_variants.VARIANTS))
def test_every_hopper_variant_has_valid_tiles(d):
    names = [var.name for var in sm90_variants.VARIANTS[d]]
    assert len(names) == len(set(names)) and "launcher" not in names
    for var in sm90_variants.VARIANTS[d]:
        for right_edge in (False, True):
            t = sm90_variants.variant_tiles(var, d, right_edge)
            base = tables.SM90[(d, right_edge)]
            assert (t.block_m // lab.CONSUMER_ROWS, t.ctas_per_sm) in lab.CONSUMER_REGS, var
            assert t.q_buffers == (var.q_buffers or base.q_buffers) and t.dynamic == var.dynamic, var
            assert t.pingpong == (base.pingpong if var.pingpong is None else var.pingpong), var


@needs_gluon
def test_hopper_variant_launches_fill_the_kernel_signature():
    q = torch.randn(2, 4, 300, 128, dtype=torch.float16)
    out = torch.empty_like(q)
    band = mask_band(300, 300, "bottom_right", (-1, -1))
    for var in sm90_variants.VARIANTS[128]:
        launch = sm90_variants.variant_launch(var, q, q, q, out, None, band, 0.1, None, 132)
        names = launch.kernel.arg_names
        params = dict(zip(names, launch.params()))
        assert len(launch.params()) == len(names) and params["q_desc"].base is q, var
        assert launch.constexprs["BLOCK_M"] == var.block_m and launch.constexprs["DYNAMIC"] == var.dynamic, var
        assert (params["tile_counter"] is not None) == var.dynamic, var
        work = 2 * 4 * -(-300 // var.block_m)
        if var.persist is None:
            tiles = sm90_variants.variant_tiles(var, 128, True)
            assert launch.grid == lab.sm90_grid(2, 4, 300, var.block_m, 132, True, tiles.ctas_per_sm, var.dynamic)
        else:
            assert launch.grid == ((min(work, var.ctas or 132) if var.persist else work), 1, 1), var


def test_profile_hopper_forces_table_tiles():
    assert profile_sm90.table_tiles("main", 128, True) == tables.SM90[(128, True)]
    assert profile_sm90.table_tiles("short", 128, False) == tables.SM90_SHORT_CAUSAL[128][0].tiles
    assert profile_sm90.table_tiles("few", 64, False) == tables.SM90_FEW_TILES[(64, False)]
    with pytest.raises(ValueError):
        profile_sm90.table_tiles("few", 128, False)
    launcher = Sm90Tiles(128, 128, 2)
    assert profile_sm90.forced_tiles(None, 2, 128, False, launcher) == launcher._replace(q_buffers=2)
    assert profile_sm90.forced_tiles("main", None, 64, True, launcher) == tables.SM90[(64, True)]
    r = _run("benchmarks.experiments.profile_sm90", "--d", "128", "--n", "1024", "--tiles", "few")
    assert r.returncode == 2 and "no such tiles for D = 128" in r.stderr, r.stderr


def test_decode_prototype_variants_agree_with_sdpa_on_the_cpu():
    # benchmarks/experiments/decode_warp_keys.py's check under the interpreter: both tile layouts, with no merge
    # (partials merged in torch), the last-arrival merge and a combine launch, against SDPA in fp32
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "src"), ROOT]), TRITON_INTERPRET="1")
    r = subprocess.run([sys.executable, "-m", "benchmarks.experiments.decode_warp_keys"], capture_output=True,
                       text=True, env=env, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    errs = ast.literal_eval(r.stdout.split("check max err:", 1)[1].strip().splitlines()[0])
    assert set(errs) == {f"{layout}/{merge}" for layout in ("2d", "wk") for merge in ("none", "arrive", "two")}
    assert max(errs.values()) < 1e-2, errs


def test_mla_decode_smoke_run_writes_a_row_per_method(tmp_path):
    # the interpreter, one tiny row of each kind: the dispatch's call, a forced candidate tile and the GQA
    # yardstick each time a row, the HBM row first
    import csv
    out = tmp_path / "mla.csv"
    r = _run("benchmarks.experiments.mla_decode", "--smoke", "--tiles", "16,16,4,1", "--out", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    rows = list(csv.DictReader(open(out)))
    assert [row["method"] for row in rows] == ["hbm"] + ["vflash", "vflash-portable", "vflash-tiles", "gqa-d128"] * 2
    assert {row["kind"] for row in rows[1:]} == {"memory", "compute"} and rows[3]["tiles"] == "16,16,4,1 x1"
    assert all(float(row["us"]) > 0 for row in rows[1:])


def test_vhead_prefill_smoke_run_writes_a_row_per_method_and_shape(tmp_path):
    # the interpreter, one tiny shape: the dispatch's call and the D 128 yardstick at each v head dim, causal or not
    import csv
    out = tmp_path / "vhead.csv"
    r = subprocess.run([sys.executable, "-m", "benchmarks.experiments.vhead_prefill", "--smoke", "--dims", "192/128",
                        "128/64", "--out", str(out)], capture_output=True, text=True, cwd=ROOT, timeout=300,
                       env=dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "src"), ROOT]),
                                TRITON_INTERPRET="1"))
    assert r.returncode == 0, r.stdout + r.stderr
    rows = list(csv.DictReader(open(out)))
    assert [(row["d_qk"], row["d_v"], row["causal"], row["method"]) for row in rows] == [
        (dq, dv, c, m) for dq, dv in (("192", "128"), ("128", "64")) for c in "01" for m in ("vflash", "vflash-d128")]


def test_ring_scaling_smoke_run_writes_rows_with_kept_fractions(tmp_path):
    # gloo on the CPU, one and two ranks, tiny shapes: every vflash row ok with its TFLOP/s a GPU and
    # its fraction of the one-rank row; PyTorch's context-parallel rows say why they did not run
    import csv
    out = tmp_path / "scaling.csv"
    r = _run("benchmarks.experiments.ring_scaling", "--smoke", "--gpus", "1,2", "--tokens", "32", "--out", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    rows = list(csv.DictReader(open(out)))
    mine = [row for row in rows if row["method"] == "vflash"]
    assert len(mine) == 8 and all(row["status"] == "ok" and float(row["tflops_per_gpu"]) > 0 for row in mine)
    assert all(row["kept"] == "1.0" for row in mine if row["R"] == "1")
    assert all(float(row["kept"]) > 0 for row in mine if row["R"] == "2")
    assert all(row["status"].startswith("skipped") for row in rows if row["method"] == "cp_sdpa_cudnn")
    png = tmp_path / "scaling.png"
    r = _run("benchmarks.experiments.ring_scaling", "--out", str(out), "--plot", str(png), "--plot-only")
    assert r.returncode == 0 and png.stat().st_size > 1000, r.stdout + r.stderr
    r = _run("benchmarks.experiments.ring_scaling", "--smoke", "--gpus", "2", "--tokens", "10", "--masks", "full",
             "--passes", "fwd", "--methods", "vflash", "--out", str(out), "--append")
    assert r.returncode == 0, r.stdout + r.stderr
    rows2 = list(csv.DictReader(open(out)))
    assert len(rows2) == len(rows) + 1 and rows2[-1]["status"] == "skipped: N not a multiple of 4"


def test_ring_scaling_kept_is_against_the_same_methods_single_gpu_row():
    from benchmarks.experiments.ring_scaling import kept_and_ratios
    base = dict(N="65536", mask="causal", status="ok")
    rows = [dict(base, method="vflash", R="1", tflops_per_gpu="500", **{"pass": "fwd"}),
            dict(base, method="vflash", R="2", tflops_per_gpu="450", **{"pass": "fwd"}),
            dict(base, method="cp_sdpa_cudnn", R="1", tflops_per_gpu="400", **{"pass": "fwd"}),
            dict(base, method="cp_sdpa_cudnn", R="2", tflops_per_gpu="300", **{"pass": "fwd"}),
            dict(base, method="vflash", R="2", tflops_per_gpu="300", **{"pass": "fwd_bwd"}),
            dict(base, method="vflash", R="8", tflops_per_gpu="475", **{"pass": "fwd"})]
    rows[-1]["N"] = "1048576"  # no single-GPU row that long: against the longest below
    kept_and_ratios(rows)
    assert [r["kept"] for r in rows] == [1.0, 0.9, 1.0, 0.75, "", 0.95]
    assert [r["single_N"] for r in rows] == [65536] * 4 + ["", 65536]
    assert [r["vs_cp_sdpa_cudnn"] for r in rows] == [1.25, 1.5, "", "", "", ""]
