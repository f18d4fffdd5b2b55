"""The serving benchmark's harness (vflash.harness.serving) on tiny decode rows through
the interpreter: every vflash method runs and its row carries a time and a bandwidth."""

import csv

import torch

from vflash.harness.serving import COLUMNS, run_serving


def test_decode_smoke_writes_every_method(tmp_path):
    out = tmp_path / "decode.csv"
    run_serving("smoke", str(out), torch.device("cpu"), printer=lambda s: None)
    with open(out) as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0].keys()) == COLUMNS
    vflash_rows = {r["method"]: r for r in rows if r["method"].startswith("vflash")}
    assert set(vflash_rows) == {"vflash_paged16", "vflash_paged64", "vflash_paged16_invariant", "vflash_contig"}
    for r in vflash_rows.values():
        assert r["status"] == "ok" and float(r["us_median"]) > 0 and r["gbps"] != ""
    assert [vflash_rows[m]["page"] for m in sorted(vflash_rows)] == ["", "16", "16", "64"]
