"""CPU tests of the benchmark helpers in bench/ (they only run on the GPU machine otherwise)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import bench_gemm  # noqa: E402


def test_bucket_key_picks_m_own_bucket_not_the_first_primed():
    # the order the autotuner fills its cache on the first call at m = 256: primed buckets 128, 64, ... first; keys
    # built by the autotuner's own key function, so a change of its layout shows up here
    import torch

    from exl3_kernels import autotune
    from exl3_kernels.plan import LayerShape

    shape = LayerShape(k=4096, ns=(11008,), k2s=(8,), codebook=1)
    plans = {autotune._key(shape, b, torch.bfloat16, torch.device("cuda", 0), False): f"plan{b}"
             for b in (128, 64, 32, 16, 8, 4, 2, 1, 256)}
    assert bench_gemm.bucket_key(plans, 256)[1] == 256
    assert bench_gemm.bucket_key(plans, 200)[1] == 256  # m = 200 is in the 256 bucket
    assert bench_gemm.bucket_key(plans, 1)[1] == 1
    with pytest.raises(KeyError, match="m bucket 512"):
        bench_gemm.bucket_key(plans, 300)


def test_report_ab_rows_and_ratio(tmp_path):
    """bench/report_ab.py: one row per (shape, K, m) of the runs, each run's time and plan, cuBLAS of the first run,
    and last / first."""
    import json
    import subprocess

    def run(us, plan="gemm(bm=16,split=6)"):
        return {"gpu": "H200", "torch": "2.11.0", "codebook": "mcg",
                "points": [{"shape": "4096x11008", "K": 4.0, "m": 1, "plan": plan, "ours_us": us,
                            "cublas_us": 25.0}]}
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(run(20.0)))
    b.write_text(json.dumps(run(19.0, "wgmma(split=3)")))
    out = tmp_path / "ab.md"
    subprocess.run([sys.executable, str(Path(__file__).resolve().parents[1] / "bench" / "report_ab.py"), str(out),
                    f"main={a}", f"new={b}", "--title", "t"], check=True, capture_output=True)
    row = [line for line in out.read_text().splitlines() if line.startswith("| 4096x11008")]
    assert row == ["| 4096x11008 | 4 | 1 | 20.0 (bm=16,split=6) | 19.0 (wgmma(split=3)) | 25.0 | 0.950 |"]
    assert set(json.loads(out.with_suffix(".json").read_text())) == {"main", "new"}


def test_replay_gap_pins_each_plan(monkeypatch):
    """bench/replay_gap.py pins a plan string as Plan.__str__ writes it, and the autotuner's pins read it back."""
    import os

    import replay_gap

    from exl3_kernels import autotune
    from exl3_kernels.plan import Plan

    for v in replay_gap.PIN_VARS:
        monkeypatch.delenv(v, raising=False)
    for plan in (Plan("gemm", 128, 5), Plan("gemm", 16, 6, lohi=True), Plan("reconstruct_n")):
        replay_gap.pin(str(plan), pdl=False)
        assert os.environ["CUDA_EXL3_PDL"] == "0"
        assert autotune._apply_pins(Plan("reconstruct"), (16,)) == plan
    for v in replay_gap.PIN_VARS:  # pin() wrote os.environ directly
        os.environ.pop(v, None)


def test_overhead_sweep_fit_recovers_a_line():
    """overhead_sweep.fit is ordinary least squares: an exact line comes back exactly, a noisy one to its mean."""
    import overhead_sweep

    a, b = overhead_sweep.fit([256, 512, 1024, 2048, 4096], [5.8 + 3.67 * k / 1024 for k in (256, 512, 1024, 2048, 4096)])
    assert a == pytest.approx(5.8) and b * 1024 == pytest.approx(3.67)
    a, b = overhead_sweep.fit([0, 0, 2, 2], [1.0, 3.0, 5.0, 7.0])  # means 2 at x = 0 and 6 at x = 2
    assert (a, b) == pytest.approx((2.0, 2.0))


def test_profile_timeline_analyse_call():
    """tools/profile_timeline.py on hand-made records: phases, the last block, SM activity, the gap, bad records."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    import profile_timeline as tl

    us = 1000
    # SM 0: two blocks back to back (0-10 us, 10-20 us), the second the tile's finisher; SM 1: one block 2-12 us
    recs = [
        [0, 1 * us, 2 * us, 3 * us, 8 * us, 9 * us, 10 * us, 0],
        [(1 << 32) | 0, 10 * us, 10 * us, 11 * us, 17 * us, 18 * us, 20 * us, 0],
        [1, 2 * us, 3 * us, 4 * us, 9 * us, 10 * us, 12 * us, 0],
        [0, 0, 0, 0, 0, 0, 0, 0],          # a region's block that never ran
        [1, 5 * us, 0, 0, 0, 0, 0, 0],     # an empty k slice (register-A): entry only
    ]
    c = tl.analyse_call(recs, sm_count=4, prev_exit=-1 * us)
    assert c["blocks"] == 3 and c["empty_blocks"] == 1 and c["finishers"] == 1
    assert c["span_us"] == pytest.approx(19.0)          # 1 us -> 20 us
    assert c["loop_med_us"] == pytest.approx(5.0) and c["loop_max_us"] == pytest.approx(6.0)
    assert c["wait_med_us"] == pytest.approx(1.0) and c["wait_max_us"] == pytest.approx(1.0)
    assert c["finish_of_finishers_med_us"] == pytest.approx(2.0)
    assert c["last_block"] == {"entry_us": 9.0, "wait": 0.0, "prologue": 1.0, "loop": 6.0, "partials": 1.0, "finish": 2.0}
    assert c["sms_used"] == 2 and c["blocks_per_sm_max"] == 2
    # SM 0 busy 1-20 us (19), SM 1 2-12 us (10), over 4 SMs x 19 us
    assert c["sm_active"] == pytest.approx(29 / 76)
    assert c["gap_from_previous_us"] == pytest.approx(2.0)
    assert c["entry_spread_us"] == pytest.approx(9.0) and c["exit_spread_us"] == pytest.approx(10.0)
    with pytest.raises(ValueError, match="out of order"):
        tl.analyse_call([[0, 5, 4, 6, 7, 8, 9, 0]], sm_count=1)
    with pytest.raises(ValueError, match="no block"):
        tl.analyse_call([[0, 0, 0, 0, 0, 0, 0, 0]], sm_count=1)
    s = tl.summarise([c, tl.analyse_call(recs, sm_count=4, prev_exit=c["_t1"])])
    assert s["span_us"] == pytest.approx(19.0) and s["period_us"] == pytest.approx(0.0)
    md = tl.markdown([{"shape": "4096x4096", "m": 1, "plan": "p", "op_us": 8.0, "summary": s}])
    assert md.count("\n") == 3 and "| 4096x4096 | 1 | p | 8.0 |" in md


def test_profile_timeline_summary_without_finishers():
    """A launch whose tiles are finished by the epilogue kernel has no finisher blocks: the summary and table keep None."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    import profile_timeline as tl

    recs = [[0, 1000, 2000, 3000, 8000, 9000, 10000, 0]]
    c = tl.analyse_call(recs, sm_count=1)
    assert c["finish_of_finishers_med_us"] is None
    s = tl.summarise([c, c])
    assert s["finish_of_finishers_med_us"] is None and s["gap_from_previous_us"] is None
    assert "(-)" in tl.markdown([{"shape": "a", "m": 1, "plan": "p", "op_us": 1.0, "summary": s}])


def test_ncu_stalls_split_and_summary(tmp_path):
    """tools/ncu_stalls.py on a hand-made source page: the role split at a SASS text, sums, wavefronts, bad input."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    import ncu_stalls

    hdr = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed", "L1 Wavefronts Shared",
           "L1 Wavefronts Shared Ideal", "stall_long_sb", "stall_dispatch", "stall_long_sb (Not Issued)"]
    rows = [["0x00", "HGMMA.64x128x16.F32 R24, gdesc[UR8], R24", "5", "10", "80", "80", "4", "1", "9"],
            ["0x10", "@P0 BRA 0x0", "7", "10", "", "", "7", "0", "9"],
            ["0x20", "USETMAXREG.DEALLOC.CTAPOOL 0x60", "0", "4", "", "", "0", "0", "0"],
            ["0x30", "STS [R15+UR6+0x1000], R20", "3", "8", "12", "8", "1", "2", "9"]]
    p = tmp_path / "source.csv"
    p.write_text('"Kernel Name","k"\n' + "\n".join(",".join(f'"{c}"' for c in r) for r in [hdr] + rows) + "\n")
    h, data = ncu_stalls.load(str(p))
    col = {n: i for i, n in enumerate(h)}
    assert ncu_stalls.split_rows(data, col, "USETMAXREG.DEALLOC") == [(0, 2), (2, 4)]
    cons, prod = (ncu_stalls.summarise(h, data[lo:hi]) for lo, hi in ncu_stalls.split_rows(data, col, "USETMAXREG"))
    assert cons == {"samples": 12, "executed": 20, "smem_wavefronts": 80, "smem_wavefronts_ideal": 80,
                    "stalls": {"long_sb": 11, "dispatch": 1}}
    assert prod["samples"] == 3 and prod["executed"] == 12 and prod["smem_wavefronts"] == 12
    assert prod["smem_wavefronts_ideal"] == 8 and prod["stalls"] == {"dispatch": 2, "long_sb": 1}
    assert list(prod["stalls"]) == ["dispatch", "long_sb"] and list(cons["stalls"]) == ["long_sb", "dispatch"]
    with pytest.raises(ValueError, match="no SASS row contains"):
        ncu_stalls.split_rows(data, col, "SETMAXNREG")
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="not an ncu"):
        ncu_stalls.load(str(bad))
    two = tmp_path / "two.csv"
    two.write_text(p.read_text() * 2)  # two kernels' pages in one file
    with pytest.raises(ValueError, match="2 kernels"):
        ncu_stalls.load(str(two))


def test_wgmma_sass_report_flags_serialized_and_spilling_kernels(capsys):
    """tools/wgmma_sass_report.py on hand-made SASS in cuobjdump's layout: a pipelined kernel (one group of 4 HGMMAs
    per stage, wait keeps 1), ptxas's serialized form (a group and a wait-all per HGMMA) and a spilling kernel."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    import wgmma_sass_report as wsr

    def fn(name, body):
        lines = [f"\t\tFunction : {name}"]
        for i, ins in enumerate(body):
            lines.append(f"        /*{16 * i:04x}*/                   {ins} ;   /* 0x0 */")
        return "\n".join(lines)

    hg = "HGMMA.64x128x16.F32 R24, gdesc[UR8], R24"
    good = ["WARPGROUP.ARRIVE", hg, hg, hg, hg + ", gsb0", "WARPGROUP.DEPBAR.LE gsb0, 0x1", "@!P0 BRA 0x0",
            "WARPGROUP.DEPBAR.LE gsb0, 0x0", "STG.E [R2.64], R150"]
    serial = []
    for _ in range(4):
        serial += ["WARPGROUP.ARRIVE", hg + ", gsb0", "UIADD3 UR8, UR8, 0x2, URZ", "WARPGROUP.DEPBAR.LE gsb0, 0x0"]
    serial += ["@!P0 BRA 0x0"]
    spill = good[:5] + ["STL [R1+0x4], R13", "LDL R13, [R1+0x4]"] + good[5:]
    # a whole group, then a wait-all before the loop's branch (an injected wait on the hot path)
    waitall = good[:5] + ["WARPGROUP.DEPBAR.LE gsb0, 0x0"] + good[5:]
    sass = "\n".join([fn("k_good", good), fn("k_serial", serial), fn("k_spill", spill), fn("k_waitall", waitall)])
    funcs = wsr.split_functions(sass)
    assert set(funcs) == {"k_good", "k_serial", "k_spill", "k_waitall"}
    # max_reg: R150 of the store, and R24 + 63 of the HGMMA accumulators (m64n128: 64 registers)
    assert wsr.report(funcs["k_good"]) == {"hgmma": 4, "serialized": 0, "wait_all": 0, "spills": 0, "max_reg": 150}
    assert wsr.report(funcs["k_waitall"])["wait_all"] == 1 and wsr.report(funcs["k_waitall"])["serialized"] == 0
    assert wsr.report(funcs["k_serial"])["max_reg"] == 87
    # the last group of the loop body is followed by the branch: 3 of the 4 count
    assert wsr.report(funcs["k_serial"])["serialized"] == 3
    assert wsr.report(funcs["k_spill"])["spills"] == 2
    import io

    sys_stdin = sys.stdin
    try:
        sys.stdin = io.StringIO(sass)
        assert wsr.main(["-", "--require", "k_good"]) == 0
        sys.stdin = io.StringIO(sass)
        assert wsr.main(["-", "--require", "k_(serial|spill)"]) == 1
        sys.stdin = io.StringIO(sass)
        assert wsr.main(["-", "--require", "k_waitall"]) == 1
        sys.stdin = io.StringIO(sass)
        assert wsr.main(["-", "--require", "no_such_kernel"]) == 2
    finally:
        sys.stdin = sys_stdin
    assert "k_serial: hgmma 4 serialized 3" in capsys.readouterr().out
