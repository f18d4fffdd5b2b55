"""ncu_summary.py reads Nsight Compute's exported pages (moved from the library's tests)."""

import sys

from benchmarks.experiments import ncu_summary


def _summary(monkeypatch, capsys, details, sass, top):
    monkeypatch.setattr(sys, "argv", ["ncu_summary", str(details), str(sass), "--top", str(top)])
    ncu_summary.main()
    return capsys.readouterr().out.splitlines()


def test_ncu_summary_ranks_sass_instructions_by_stall_samples(tmp_path, monkeypatch, capsys):
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
    lines = _summary(monkeypatch, capsys, details, sass, 2)
    assert "Duration     ms     4.07" in lines and not any("Something Else" in x for x in lines)
    top = lines[lines.index("## Top 2 SASS instructions by warp-stall samples (of 25)") + 1:]
    assert top[0].split()[:3] == ["0x20", "20", "80.0%"] and "long_sb 20" in top[0]
    assert "MUFU.EX2" in top[1] and "wait 4, long_sb 1" in top[1]
    mix = lines[lines.index("## Instruction mix (executed, from the SASS source page)") + 1:]
    assert mix[0].split()[:2] in (["MUFU.EX2", "100"], ["FADD", "100"])


def test_ncu_summary_splits_stall_samples_by_partition_and_key_loop(tmp_path, monkeypatch, capsys):
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
    lines = _summary(monkeypatch, capsys, details, sass, 1)
    assert any(x.split()[:4] == ["consumer", "0", "40", "40.0%"] and x.endswith("75.0%") for x in lines), lines
    assert any(x.split()[:3] == ["producer", "60", "60.0%"] for x in lines), lines
    top = lines[lines.index("## Top 1 SASS instructions by warp-stall samples (of 100)") + 1]
    assert "producer" in top and "UTMALDG" in top
