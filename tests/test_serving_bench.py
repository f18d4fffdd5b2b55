"""The serving benchmark's harness (vflash.harness.serving) on tiny decode rows through
the interpreter: every vflash method runs and its row carries a time and a bandwidth."""

import csv

import torch

from vflash.harness.serving import COLUMNS, run_serving
from _devices import needs_interpreter

# CPU tensors run through Triton's interpreter, which some Triton / numpy pairs refuse (the GPU machine's)


@needs_interpreter
def test_decode_smoke_writes_every_method(tmp_path):
    out = tmp_path / "decode.csv"
    run_serving("smoke", str(out), torch.device("cpu"), printer=lambda s: None)
    with open(out) as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0].keys()) == COLUMNS
    vflash_rows = {r["method"]: r for r in rows if r["method"].startswith("vflash")}
    assert set(vflash_rows) == {"vflash_paged16", "vflash_paged64", "vflash_paged16_invariant", "vflash_paged1",
                                "vflash_contig"}
    for r in vflash_rows.values():
        assert r["status"] == "ok" and float(r["us_median"]) > 0 and r["gbps"] != ""
    assert [vflash_rows[m]["page"] for m in sorted(vflash_rows)] == ["", "1", "16", "16", "64"]


@needs_interpreter
def test_chunked_rows_check_every_output_against_dense():
    # tiny chunked rows through the interpreter: each cache layout's output is compared with
    # vflash.attention's on the same work, and one that differs is marked wrong, not timed as right
    from vflash.harness import serving
    rows = serving.chunked_rows(2, 5, 27, (4, 2, 16), torch.bfloat16, torch.device("cpu"))
    checked = {r["method"]: r for r in rows if r["method"] != "vflash_dense"}
    assert set(checked) == {"vflash_paged16", "vflash_paged16_in_order", "vflash_paged64", "vflash_contig",
                            "vflash_varlen"}
    assert {r["method"]: r["page"] for r in rows if "paged" in r["method"]} == {
        "vflash_paged16": 16, "vflash_paged16_in_order": 16, "vflash_paged64": 64}
    for r in checked.values():
        assert r["status"] == "ok" and float(r["max_diff_vs_dense"]) <= serving.CHUNKED_MAX_DIFF, r


@needs_interpreter
def test_chunked_rows_mark_a_wrong_output(monkeypatch):
    import vflash
    from vflash.harness import serving
    real = vflash.attention_varlen
    monkeypatch.setattr(vflash, "attention_varlen", lambda *a, **kw: real(*a, **kw) + 1.0)
    rows = serving.chunked_rows(1, 4, 12, (2, 1, 16), torch.bfloat16, torch.device("cpu"))
    by = {r["method"]: r for r in rows}
    assert by["vflash_varlen"]["status"].startswith("wrong") and by["vflash_contig"]["status"] == "ok"



def test_host_time_is_the_least_round_with_its_probe(monkeypatch):
    # a fake clock that each call advances by its round's cost (10 warm-up calls, then rounds of 3 calls
    # costing 4, 1 and 2 us): the least round's mean is kept, not the first round's or the mean of all,
    # with the CPU probe timed after that round (7, 3, 5 us after the three rounds)
    from vflash.harness import serving
    now = [0.0]
    costs = iter([0.0] * 10 + [4e-6] * 3 + [1e-6] * 3 + [2e-6] * 3)
    probes = iter([7.0, 3.0, 5.0])

    def call():
        now[0] += next(costs)
    monkeypatch.setattr(serving.time, "perf_counter", lambda: now[0])
    monkeypatch.setattr(serving, "_cpu_probe_us", lambda: next(probes))
    host, probe = serving._host_us(call, torch.device("cpu"), n=3, rounds=3)
    assert abs(host - 1.0) < 1e-9 and probe == 3.0


def test_cpu_probe_times_its_loop():
    from vflash.harness import serving
    assert 0 < serving._cpu_probe_us(n=3) < 1e6


def test_rates_and_ratios_keep_three_figures_when_small():
    # an interpreter run moves few bytes in many microseconds: its GB/s and ratios must not round to 0
    from vflash.harness import serving
    assert serving._round_kept(4400.123, 1) == 4400.1 and serving._round_kept(1.23456, 3) == 1.235
    assert serving._round_kept(0.00123456, 1) == 0.00123 and serving._round_kept(0.0004321, 3) == 0.000432
    assert serving._round_kept(0.0, 1) == 0.0
    row = {}
    serving._put_stats(row, (40325.58, 40000.0, 41000.0, 3), "gbps", 2048 / 1e3)
    assert 0 < row["gbps"] < 1e-4


@needs_interpreter
def test_merge_and_write_rows_check_their_outputs(monkeypatch):
    # merge_states and write_kvcache rows (tiny, through the interpreter): each method's output is checked
    # (the fp64 merge; the cache's rows) before it is timed, against a PyTorch-ops row of the same work
    import vflash
    from vflash.harness import serving
    cpu = torch.device("cpu")
    merge = {r["method"]: r for r in serving.merge_rows(1, 2, 5, 16, cpu)}
    write = {r["method"]: r for r in serving.write_rows(5, (2, 16), 4, cpu)}
    for rows in (merge, write):
        assert set(rows) in ({"vflash_merge", "torch_merge"}, {"vflash_write", "torch_write"})
        for r in rows.values():
            assert r["status"] == "ok" and float(r["us_median"]) > 0 and r["gbps"] > 0 and r["vs_torch"] > 0, r
    real_merge, real_write = vflash.merge_states, vflash.write_kvcache
    monkeypatch.setattr(vflash, "merge_states", lambda *a: (real_merge(*a)[0] + 0.1, real_merge(*a)[1]))
    monkeypatch.setattr(vflash, "write_kvcache", lambda kc, vc, k, v, s, **kw: real_write(kc, vc, k, -v, s, **kw))
    assert serving.merge_rows(1, 2, 5, 16, cpu)[0]["status"].startswith("wrong")
    assert serving.write_rows(5, (2, 16), 4, cpu)[0]["status"].startswith("wrong")
