"""Experiment scripts kept in the repository still run (their correctness half)."""

import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU run times the variants; CI checks them on the CPU")
def test_fwd_variants_check_half_passes_under_the_interpreter():
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "src"))
    r = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks/experiments/fwd_variants.py"), "--check-only"],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("PASS") == 12 and "FAIL" not in r.stdout and "ERROR" not in r.stdout


def _sass_check(variants: str) -> subprocess.CompletedProcess:
    # sass_schedule.py --check on compile_sm90 builds (a Python list of keyword
    # dicts), with the ptxas that Triton ships; asserts the check passed.
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "src"), TRITON_INTERPRET="0")
    r = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks/experiments/sass_schedule.py"), "--check",
                        "--variants", variants], capture_output=True, text=True, env=env, timeout=900)
    assert r.returncode == 0 and "CHECK PASS" in r.stdout, r.stdout + r.stderr[-3000:]
    return r


def test_late_pv_wait_keeps_the_pv_wait_after_the_exponentials_in_the_sass():
    # LATE_PV_WAIT's whole point is a ptxas scheduling decision: compiled for sm_90
    # with the ptxas that Triton ships, every key-tile loop must wait for its PV
    # product only after its last MUFU.EX2 (benchmarks/NOTES.md session 7, lead h).
    r = _sass_check("[dict(head_dim=128, q_buffers=2, lse=False, late_pv_wait=True)]")
    assert r.stdout.count("after the exponentials") >= 2 and "before the exponentials" not in r.stdout, r.stdout


def test_p_carried_between_key_tiles_needs_no_byte_shuffles_in_the_sass():
    # The 16-bit P goes from one key tile to the next packed two to a 32-bit
    # register: carried as separate halves, ptxas paired them in the opposite order
    # to the PV product's operand and swapped each pair back with a PRMT (32 a key
    # tile at D = 64, 7 % of the loop; NOTES session 9). The build is the three-
    # consumer D = 64 kernel the launcher runs without a right mask edge.
    r = _sass_check("[dict(head_dim=64, block_m=192, q_buffers=2, pingpong=True, lse=False)]")
    assert r.stdout.count(" 0 PRMT") >= 2 and "loop:" in r.stdout, r.stdout


def test_ncu_summary_ranks_sass_instructions_by_stall_samples(tmp_path):
    details = tmp_path / "p.details.txt"
    details.write_text("    Section: GPU Speed Of Light Throughput\n    Duration     ms     4.07\n"
                       "    SM: Pipe Tensor Cycles Active     %     57.14\n    Something Else   %   1\n")
    sass = tmp_path / "p.sass.csv"
    sass.write_text('"Kernel Name","k",\n'
                    '"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed",'
                    '"stall_wait","stall_long_sb","stall_wait (Not Issued)"\n'
                    '"0x10","      MUFU.EX2 R1, R1","5","100","4","1","0"\n'
                    '"0x20","@!P0  BRA 0x10","20","50","0","20","0"\n'
                    '"0x30","      FADD R2, R1, R2","0","100","0","0","0"\n')
    r = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks/experiments/ncu_summary.py"), str(details),
                        str(sass), "--top", "2"], capture_output=True, text=True, check=True)
    lines = r.stdout.splitlines()
    assert "Duration     ms     4.07" in lines and not any("Something Else" in x for x in lines)
    top = lines[lines.index("## Top 2 SASS instructions by warp-stall samples (of 25)") + 1:]
    assert top[0].split()[:3] == ["0x20", "20", "80.0%"] and "long_sb 20" in top[0]
    assert "MUFU.EX2" in top[1] and "wait 4, long_sb 1" in top[1]
    mix = lines[lines.index("## Instruction mix (executed, from the SASS source page)") + 1:]
    assert mix[0].split()[:2] in (["MUFU.EX2", "100"], ["FADD", "100"])


def test_ncu_summary_splits_stall_samples_by_partition_and_key_loop(tmp_path):
    # Two regions opened by setmaxnreg markers: a consumer (HGMMA) whose 70-instruction
    # loop holds 30 of its 40 samples, and a producer (UTMALDG) with 60.
    details = tmp_path / "p.details.txt"
    details.write_text("    Duration     ms     1.00\n")
    rows = ['"0x000","      USETMAXREG.TRY_ALLOC.CTAPOOL UP0, 0xf0","0","1"',
            '"0x010","      HGMMA.64x128x16.F32 R24, gdesc[UR16], RZ","10","1"']
    rows += [f'"0x{16 * k:03x}","      FADD R2, R1, R2","{30 if k == 5 else 0}","1"' for k in range(2, 72)]
    rows += ['"0x480","@!P0  BRA 0x020","0","1"', '"0x490","      USETMAXREG.DEALLOC.CTAPOOL 0x18","0","1"',
             '"0x4a0","@UP0  UTMALDG.4D [UR8], [UR16]","60","1"']
    sass = tmp_path / "p.sass.csv"
    sass.write_text('"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed"\n'
                    + "\n".join(rows) + "\n")
    r = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks/experiments/ncu_summary.py"), str(details),
                        str(sass), "--top", "1"], capture_output=True, text=True, check=True)
    lines = r.stdout.splitlines()
    assert any(x.split()[:4] == ["consumer", "0", "40", "40.0%"] and x.endswith("75.0%") for x in lines), r.stdout
    assert any(x.split()[:3] == ["producer", "60", "60.0%"] for x in lines), r.stdout
    top = lines[lines.index("## Top 1 SASS instructions by warp-stall samples (of 100)") + 1]
    assert "producer" in top and "UTMALDG" in top
