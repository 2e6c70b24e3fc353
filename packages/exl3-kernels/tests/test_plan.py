"""The planner's rules (pure functions; the GPU autotuner times the candidates it proposes)."""
from __future__ import annotations

import math

import pytest
import torch

from exl3_kernels.plan import (BLOCKS_PER_SM, LayerShape, Plan, candidates, cost_model, m_bucket, max_split,
                               pick_bm, splitk_allowed, wave_efficiency, wave_splits)

SHAPES = [LayerShape(4096, (11008,), (8,), 1), LayerShape(17408, (5120,), (8,), 1),
          LayerShape(4096, (4096, 1024, 1024), (8, 10, 10), 2), LayerShape(512, (256,), (4,), 0)]
ACC = 16 << 20


def test_buckets_and_tiers():
    assert [m_bucket(m) for m in (1, 2, 3, 16, 17, 1000)] == [1, 2, 4, 16, 32, 1024]
    assert [pick_bm(m) for m in (1, 16, 17, 33, 100, 129, 5000)] == [16, 16, 32, 64, 128, 128, 128]
    assert pick_bm(20, (16, 64)) == 64


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("m", [1, 3, 16, 64, 100, 256])
def test_cost_model_split_rules(shape, m):
    p = cost_model(shape, m, 132, ACC)
    assert p.path == "gemm" and p.bm == pick_bm(m)
    assert 1 <= p.split <= max_split(shape)
    assert splitk_allowed(shape, m, p.split, ACC)
    blocks = (shape.n_total // 128) * math.ceil(m / p.bm)
    cap = BLOCKS_PER_SM[p.bm] * 132
    if p.split > 1:  # split only to fill the machine
        assert blocks < cap
    allowed = [s for s in range(1, max_split(shape) + 1) if splitk_allowed(shape, m, s, ACC)]
    if blocks * max(allowed) < cap:  # cannot fill one wave: the largest allowed split
        assert p.split == max(allowed)
    else:  # never into a mostly empty extra wave
        assert wave_efficiency(blocks * p.split, cap) >= 0.5


def test_deterministic_and_reconstruct_threshold():
    for shape in SHAPES:
        assert cost_model(shape, 1, 132, ACC, deterministic=True).split == 1
        assert all(c.split == 1 for c in candidates(shape, 8, 132, ACC, deterministic=True))
        assert cost_model(shape, 1024, 132, ACC) == Plan("reconstruct")
        assert cost_model(shape, 4096, 132, ACC, recon_min_m=8192).path == "gemm"


def test_splitk_traffic_and_capacity():
    big = LayerShape(4096, (151936,), (12,), 2)  # an lm_head
    assert not splitk_allowed(big, 256, 2, acc_capacity=1 << 20)  # accumulator does not fit
    small = LayerShape(4096, (4096,), (4,), 1)
    assert splitk_allowed(small, 1, 16, ACC)
    assert not splitk_allowed(small, 4096, 2, ACC)  # traffic far above the trellis bytes


def test_wave_splits_fill_whole_waves():
    shape = SHAPES[0]  # 86 column blocks
    cap = BLOCKS_PER_SM[16] * 132
    for s in wave_splits(shape, 1, 16, 132):
        w = math.ceil(86 * s / cap)
        assert 86 * s <= w * cap and 86 * (s + 1) > w * cap or s == max_split(shape)


def test_reconstruct_paths_offered_from_m_64():
    shape = SHAPES[0]
    for m, offered in ((1, False), (63, False), (64, True), (4096, True)):
        paths = {c.path for c in candidates(shape, m, 132, ACC)}
        assert ({"reconstruct", "reconstruct_act", "reconstruct_n"} <= paths) == offered, (m, paths)
    assert str(Plan("reconstruct_act")) == "reconstruct_act" and str(Plan("gemm", 64, 4)) == "gemm(bm=64,split=4)"


def test_path_pin_accepts_the_three_paths(monkeypatch):
    from exl3_kernels import autotune

    for path in ("gemm", "reconstruct", "reconstruct_act", "reconstruct_n"):
        monkeypatch.setenv("CUDA_EXL3_PATH", path)
        assert autotune._apply_pins(Plan("gemm", 16, 2)).path == path
    monkeypatch.setenv("CUDA_EXL3_PATH", "dense")
    with pytest.raises(ValueError, match="reconstruct_act"):
        autotune._apply_pins(Plan("gemm"))


def test_autotune_flush_covers_the_l2():
    from exl3_kernels.autotune import flush_bytes

    assert flush_bytes(60 << 20) == 75 << 20  # H200 (60 MiB L2 per ../shared/docs/anchors-h200.md)
    assert flush_bytes(128 << 20) == 160 << 20  # RTX PRO 6000 class
    assert flush_bytes(50 * 10 ** 6) >= 50 * 10 ** 6 * 5 // 4 and flush_bytes(50 * 10 ** 6) % (1 << 20) == 0
    assert flush_bytes(0) == 1 << 20


def test_autotune_retimes_close_candidates_and_picks_the_fastest_finalist(monkeypatch):
    """Timing logic on CPU with a fake timer: first pass 100/105/109/150 us (three within 10%), second pass
    reverses the order of the close three; the choice follows the second pass, the slow one is never re-timed."""
    from exl3_kernels import autotune
    from exl3_kernels.plan import LayerShape

    monkeypatch.delenv("CUDA_EXL3_DETERMINISTIC", raising=False)
    monkeypatch.delenv("CUDA_EXL3_AUTOTUNE", raising=False)
    monkeypatch.delenv("CUDA_EXL3_PATH", raising=False)
    monkeypatch.setattr(autotune.torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(autotune, "sm_count", lambda device: 132)
    plans = [Plan("gemm", 64, 1), Plan("gemm", 64, 2), Plan("reconstruct"), Plan("reconstruct_act")]
    monkeypatch.setattr(autotune, "candidates", lambda *a, **k: list(plans))
    monkeypatch.setattr(autotune, "cost_model", lambda *a, **k: plans[0])  # the fallback is one of the candidates
    first = {plans[0]: 0.100, plans[1]: 0.105, plans[2]: 0.109, plans[3]: 0.150}  # ms
    second = {plans[0]: 0.120, plans[1]: 0.110, plans[2]: 0.090}
    calls: list[tuple[Plan, int]] = []
    last: list[Plan] = []

    def fake_time(fn, device, reps=5, graph=False):
        fn()
        calls.append((last[-1], reps))
        return first[last[-1]] if reps == 5 else second[last[-1]]

    monkeypatch.setattr(autotune, "_time", fake_time)
    autotune.clear()
    shape = LayerShape(4096, (11008,), (8,), 1)
    chosen = autotune.choose(shape, 256, torch.float16, torch.device("cpu"), ACC, (16, 32, 64, 128), last.append)
    assert chosen == Plan("reconstruct")
    assert [p for p, r in calls if r == autotune.FINALIST_REPS] == plans[:3]
    t = next(iter(autotune.cached_timings().values()))
    assert t["first"] == {str(p): 1000.0 * v for p, v in first.items()}
    assert t["finalists"] == {str(p): 1000.0 * v for p, v in second.items()}
    autotune.clear()


def test_kernel_count_per_plan(monkeypatch):
    """Kernels per call: input transform (unless fused) + GEMM + split-k epilogue (through the accumulator only, and
    only without the GEMM's own split-k finish, CUDA_EXL3_SPLITK_FINISH=0 here; see the test below)."""
    from exl3_kernels.autotune import kernel_count

    monkeypatch.setenv("CUDA_EXL3_SPLITK_FINISH", "0")
    assert kernel_count(Plan("gemm", 16, 1)) == 2
    assert kernel_count(Plan("gemm", 16, 16)) == 3
    assert kernel_count(Plan("gemm", 16, 8, cluster=True)) == 2
    assert kernel_count(Plan("gemm", 16, 8, fused_it=True)) == 2
    assert kernel_count(Plan("gemm", 16, 4, cluster=True, fused_it=True)) == 1
    assert kernel_count(Plan("gemm", 16, 1, fused_it=True)) == 1
    assert kernel_count(Plan("wgmma", 256, 1)) == 2 and kernel_count(Plan("wgmma", 256, 3)) == 3
    assert [kernel_count(Plan(p)) for p in ("reconstruct", "reconstruct_n", "reconstruct_act")] == [2, 3, 4]
    # CUDA_EXL3_CLUSTER=1: every split-k GEMM reduces in a cluster (no epilogue kernel); wgmma still uses the accumulator
    assert kernel_count(Plan("gemm", 16, 16), cluster_forced=True) == 2
    assert kernel_count(Plan("gemm", 16, 8, fused_it=True), cluster_forced=True) == 1
    assert kernel_count(Plan("wgmma", 256, 3), cluster_forced=True) == 3


@pytest.mark.parametrize("fused_us, expect_fused", [(13.6, True), (13.8, True), (13.9, False), (14.0, False)])
def test_autotune_prefers_fewer_kernels_within_the_node_tie(monkeypatch, fused_us, expect_fused):
    """Eager timing (the default; CUDA_EXL3_AUTOTUNE_GRAPH=0): a finalist with fewer kernels wins when its finalist time is within
    NODE_TIE_US (0.5 us) of the fastest: 4096x4096 m = 4 timed gemm(bm=16,split=16) 13.3 us and
    gemm(bm=16,split=8,it) 13.6 us eagerly, and replays them at 11.7 and 10.0 us. Beyond the tie the fastest stays;
    among several within it, the fewest kernels."""
    from exl3_kernels import autotune
    from exl3_kernels.plan import LayerShape

    for v in ("DETERMINISTIC", "AUTOTUNE", "PATH", "BM", "SPLIT", "LOHI"):
        monkeypatch.delenv("CUDA_EXL3_" + v, raising=False)
    monkeypatch.setenv("CUDA_EXL3_AUTOTUNE_GRAPH", "0")
    # 3 / 2 / 1 kernels: the counts with the split-k epilogue kernel (with the GEMM's own split-k finish the first two
    # plans would be 2 / 1 kernels, test_kernel_count_with_the_split_k_finish_in_the_gemm)
    monkeypatch.setenv("CUDA_EXL3_SPLITK_FINISH", "0")
    monkeypatch.setattr(autotune.torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(autotune, "sm_count", lambda device: 132)
    plain, fused, one = Plan("gemm", 16, 16), Plan("gemm", 16, 8, fused_it=True), Plan("gemm", 16, 4, cluster=True, fused_it=True)
    plans = [plain, fused, one]
    monkeypatch.setattr(autotune, "candidates", lambda *a, **k: list(plans))
    monkeypatch.setattr(autotune, "cost_model", lambda *a, **k: plain)
    times = {plain: 13.3e-3, fused: fused_us * 1e-3, one: 14.5e-3}  # ms; `one` is 1.2 us slower: outside the tie
    last: list[Plan] = []

    def fake_time(fn, device, reps=5, graph=False):
        fn()
        return times[last[-1]]

    monkeypatch.setattr(autotune, "_time", fake_time)
    autotune.clear()
    shape = LayerShape(4096, (4096,), (8,), 1)
    chosen = autotune.choose(shape, 4, torch.float16, torch.device("cpu"), ACC, (16, 32, 64, 128), last.append)
    assert chosen == (fused if expect_fused else plain)
    times[one] = 13.7e-3  # now the one-kernel plan is within the tie too: it wins over both
    autotune.clear()
    assert autotune.choose(shape, 4, torch.float16, torch.device("cpu"), ACC, (16, 32, 64, 128), last.append) == one
    autotune.clear()


def test_autotune_times_small_buckets_as_graph_replays_without_the_node_tie(monkeypatch):
    """With CUDA_EXL3_AUTOTUNE_GRAPH=1, buckets up to GRAPH_MAX_M (256) are timed with graph=True, larger ones eagerly;
    unset or 0, every bucket eagerly. With graph timings the fastest finalist is chosen even when a plan with fewer
    kernels is within NODE_TIE_US (the graph replay already credits the missing kernels); eager timings keep the tie
    rule."""
    from exl3_kernels import autotune
    from exl3_kernels.plan import LayerShape

    for v in ("DETERMINISTIC", "AUTOTUNE", "AUTOTUNE_GRAPH", "PATH", "BM", "SPLIT", "LOHI"):
        monkeypatch.delenv("CUDA_EXL3_" + v, raising=False)
    monkeypatch.setattr(autotune.torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(autotune, "sm_count", lambda device: 132)
    plain, fused = Plan("gemm", 16, 16), Plan("gemm", 16, 8, fused_it=True)
    monkeypatch.setattr(autotune, "candidates", lambda *a, **k: [plain, fused])
    monkeypatch.setattr(autotune, "cost_model", lambda *a, **k: plain)
    times = {plain: 13.3e-3, fused: 13.6e-3}  # ms: the fused plan (2 kernels, plain 3) is 0.3 us slower
    modes: list[tuple[int, bool]] = []
    last: list[Plan] = []
    m_now = [0]

    def fake_time(fn, device, reps=5, graph=False):
        fn()
        modes.append((m_now[0], graph))
        return times[last[-1]]

    monkeypatch.setattr(autotune, "_time", fake_time)
    shape, dev = LayerShape(4096, (4096,), (8,), 1), torch.device("cpu")
    assert autotune.GRAPH_MAX_M == 256
    monkeypatch.setenv("CUDA_EXL3_AUTOTUNE_GRAPH", "1")
    for m, graph in ((1, True), (4, True), (129, True), (256, True), (257, False), (2048, False)):
        autotune.clear()
        modes.clear()
        m_now[0] = m
        chosen = autotune.choose(shape, m, torch.float16, dev, ACC, (16, 32, 64, 128), last.append)
        assert modes and all(g is graph for _, g in modes), (m, modes)
        assert chosen == (plain if graph else fused), (m, chosen)
    for value in ("0", None):
        if value is None:
            monkeypatch.delenv("CUDA_EXL3_AUTOTUNE_GRAPH")
        else:
            monkeypatch.setenv("CUDA_EXL3_AUTOTUNE_GRAPH", value)
        autotune.clear()
        modes.clear()
        m_now[0] = 4
        assert autotune.choose(shape, 4, torch.float16, dev, ACC, (16, 32, 64, 128), last.append) == fused
        assert modes and not any(g for _, g in modes)
    autotune.clear()


def test_autotune_prime_tunes_every_smaller_bucket_on_the_first_rows(monkeypatch):
    """A first call at m = 3000 (bucket 4096) tunes buckets 2048, 1024, ..., 1 on the first b rows, skips the
    buckets already cached, and does nothing under CUDA_EXL3_AUTOTUNE_PRIME=0 or in deterministic mode."""
    from exl3_kernels import autotune
    from exl3_kernels.plan import LayerShape

    for v in ("DETERMINISTIC", "AUTOTUNE", "AUTOTUNE_PRIME", "PATH", "BM", "SPLIT"):
        monkeypatch.delenv(f"CUDA_EXL3_{v}", raising=False)
    monkeypatch.setattr(autotune.torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(autotune, "sm_count", lambda device: 132)
    plans = [Plan("gemm", 16, 1), Plan("reconstruct")]
    monkeypatch.setattr(autotune, "candidates", lambda *a, **k: list(plans))
    monkeypatch.setattr(autotune, "cost_model", lambda *a, **k: plans[0])
    monkeypatch.setattr(autotune, "_time", lambda fn, device, reps=5, graph=False: (fn(), 0.1)[1])
    rows_seen: list[int] = []
    shape, dev = LayerShape(4096, (11008,), (8,), 1), torch.device("cpu")
    args = (torch.float16, dev, ACC, (16, 32, 64, 128), lambda p, rows: rows_seen.append(rows))
    autotune.clear()
    autotune.choose(shape, 200, torch.float16, dev, ACC, (16, 32, 64, 128), lambda p: None)  # bucket 256 cached
    assert autotune.is_cached(shape, 129, torch.float16, dev) and not autotune.is_cached(shape, 3000, torch.float16, dev)
    assert autotune.prime_smaller_buckets(shape, 3000, *args) == 11  # 2048 .. 1 without 256
    assert sorted(set(rows_seen)) == [1, 2, 4, 8, 16, 32, 64, 128, 512, 1024, 2048]
    assert all(autotune.is_cached(shape, b, torch.float16, dev) for b in (1, 3, 700, 2048))
    assert not autotune.is_cached(shape, 3000, torch.float16, dev)  # the call's own bucket is left to choose()
    assert autotune.prime_smaller_buckets(shape, 3000, *args) == 0  # all cached now
    autotune.clear()
    runs_before = len(rows_seen)
    monkeypatch.setenv("CUDA_EXL3_AUTOTUNE_PRIME", "0")
    assert autotune.prime_smaller_buckets(shape, 3000, *args) == 0
    monkeypatch.setenv("CUDA_EXL3_AUTOTUNE_PRIME", "1")
    monkeypatch.setenv("CUDA_EXL3_DETERMINISTIC", "1")
    assert autotune.prime_smaller_buckets(shape, 3000, *args) == 0
    monkeypatch.delenv("CUDA_EXL3_DETERMINISTIC")
    monkeypatch.setenv("CUDA_EXL3_AUTOTUNE", "0")
    assert autotune.prime_smaller_buckets(shape, 3000, *args) == 0
    monkeypatch.delenv("CUDA_EXL3_AUTOTUNE")
    for pin, value in (("PATH", "gemm"), ("BM", "64"), ("SPLIT", "2")):  # pinned plans need no timing
        monkeypatch.setenv(f"CUDA_EXL3_{pin}", value)
        assert autotune.prime_smaller_buckets(shape, 3000, *args) == 0
        monkeypatch.delenv(f"CUDA_EXL3_{pin}")
    monkeypatch.setattr(autotune.torch.cuda, "is_current_stream_capturing", lambda: True)
    assert autotune.prime_smaller_buckets(shape, 3000, *args) == 0
    assert not autotune.cached_plans() and len(rows_seen) == runs_before  # nothing was timed by the early exits
    monkeypatch.setattr(autotune.torch.cuda, "is_current_stream_capturing", lambda: False)
    assert autotune.prime_smaller_buckets(shape, 3000, *args) == 12  # and it still works afterwards
    autotune.clear()


def test_blocks_per_sm_matches_the_kernel_launch_bounds():
    """plan.BLOCKS_PER_SM is the cost model's copy of the kernel's __launch_bounds__ minimum blocks per SM
    (GemmOccupancy in csrc/gemm/gemm_kernel.cuh): the two must not drift apart."""
    import re
    from pathlib import Path

    src = (Path(__file__).resolve().parents[1] / "csrc" / "gemm" / "gemm_kernel.cuh").read_text()
    defaults = {int(bm): int(v) for bm, v in re.findall(r"#define EXL3_GEMM_MIN_BLOCKS_BM(\d+) (\d+)", src)}
    assert set(defaults) == {16, 32, 64}
    for bm, v in defaults.items():
        assert BLOCKS_PER_SM[bm] == v, (bm, BLOCKS_PER_SM[bm], v)
    assert re.search(r"BM <= 64 \? EXL3_GEMM_MIN_BLOCKS_BM64 : 2\)", src) and BLOCKS_PER_SM[128] == 2


def test_lohi_candidates_and_pin(monkeypatch):
    """The lohi variant is offered for the tiers that have it, with the plain tier's splits; CUDA_EXL3_LOHI=1 sets
    it only where an instance exists (gemm path, BM in lohi_bm) and =0 clears it."""
    from exl3_kernels import autotune

    for v in ("PATH", "BM", "SPLIT", "LOHI"):
        monkeypatch.delenv(f"CUDA_EXL3_{v}", raising=False)
    shape = LayerShape(4096, (11008,), (8,), 1)
    base = candidates(shape, 4, 132, ACC)
    with_lohi = candidates(shape, 4, 132, ACC, lohi_bm=(16,))
    extra = [p for p in with_lohi if p not in base]
    assert extra and all(p.path == "gemm" and p.bm == 16 and p.lohi for p in extra)
    assert sorted(p.split for p in extra) == sorted(p.split for p in base if p.path == "gemm" and p.bm == 16)
    assert str(extra[0]).endswith(",lohi)") and str(Plan("gemm", 16, 2)) == "gemm(bm=16,split=2)"
    assert candidates(shape, 200, 132, ACC, lohi_bm=(16,)) == candidates(shape, 200, 132, ACC)  # BM16 not a tier there
    monkeypatch.setenv("CUDA_EXL3_LOHI", "1")
    assert autotune._apply_pins(Plan("gemm", 16, 4), (16,)).lohi
    assert not autotune._apply_pins(Plan("gemm", 32, 4), (16,)).lohi  # no BM32 lohi instance
    assert not autotune._apply_pins(Plan("gemm", 16, 4), ()).lohi  # e.g. mul1: none at all
    assert not autotune._apply_pins(Plan("reconstruct"), (16,)).lohi
    monkeypatch.setenv("CUDA_EXL3_LOHI", "0")
    assert not autotune._apply_pins(Plan("gemm", 16, 4, lohi=True), (16,)).lohi


def test_swapped_bm8_candidates_and_pins(monkeypatch):
    """BM 8 (SWAP_BM) exists only as the lohi form: offered for m <= 8 where lohi_bm has it, with the splits of a BM 8
    grid, never above m = 8; a pinned BM 8 is lohi where built and falls back to the smallest plain tier where not
    (CUDA_EXL3_LOHI=0, a codebook without lohi), and a tuned BM 8 plan with CUDA_EXL3_LOHI=0 does the same."""
    from exl3_kernels import autotune
    from exl3_kernels.plan import SWAP_BM, candidate_splits

    for v in ("PATH", "BM", "SPLIT", "LOHI"):
        monkeypatch.delenv(f"CUDA_EXL3_{v}", raising=False)
    assert SWAP_BM == 8 and BLOCKS_PER_SM[SWAP_BM] == BLOCKS_PER_SM[16]  # GemmOccupancy: BM <= 16 share the value
    shape = LayerShape(4096, (11008,), (8,), 1)
    for m in (1, 5, 8):
        with8 = candidates(shape, m, 132, ACC, lohi_bm=(8, 16))
        sw = [p for p in with8 if p.bm == SWAP_BM]
        assert sw and all(p.path == "gemm" and p.lohi and not p.cluster and not p.fused_it for p in sw)
        assert [p.split for p in sw] == candidate_splits(shape, m, SWAP_BM, 132, ACC)
        assert [p for p in with8 if p.bm != SWAP_BM] == candidates(shape, m, 132, ACC, lohi_bm=(16,))
    for m in (9, 16, 64):
        assert not [p for p in candidates(shape, m, 132, ACC, lohi_bm=(8, 16)) if p.bm == SWAP_BM], m
    assert not [p for p in candidates(shape, 1, 132, ACC, lohi_bm=(16,)) if p.bm == SWAP_BM]  # not built
    det = [p for p in candidates(shape, 1, 132, ACC, deterministic=True, lohi_bm=(8, 16)) if p.bm == SWAP_BM]
    assert [p.split for p in det] == [1]  # deterministic mode: no atomics
    built = (16, 32, 64, 128)
    monkeypatch.setenv("CUDA_EXL3_BM", "8")
    assert autotune._apply_pins(Plan("gemm", 16, 4), (8, 16), built) == Plan("gemm", 8, 4, lohi=True)
    assert autotune._apply_pins(Plan("gemm", 16, 4), (), built) == Plan("gemm", 16, 4)  # mul1: no lohi at all
    monkeypatch.setenv("CUDA_EXL3_LOHI", "0")
    assert autotune._apply_pins(Plan("gemm", 16, 4), (8, 16), built) == Plan("gemm", 16, 4)
    monkeypatch.delenv("CUDA_EXL3_BM")
    assert autotune._apply_pins(Plan("gemm", 8, 2, lohi=True), (8, 16), built) == Plan("gemm", 16, 2)
    monkeypatch.setenv("CUDA_EXL3_LOHI", "1")
    assert autotune._apply_pins(Plan("gemm", 8, 2, lohi=True), (8, 16), built) == Plan("gemm", 8, 2, lohi=True)
    monkeypatch.delenv("CUDA_EXL3_LOHI")
    assert autotune._apply_pins(Plan("gemm", 8, 2, lohi=True), (8, 16), built) == Plan("gemm", 8, 2, lohi=True)


def test_fused_swap_candidates_and_pins(monkeypatch):
    """The BM 8 swapped form with the input transform inside: offered with ``fused_swap`` for m <= 8 at the BM 8 splits
    whose k slice fits FUSED_IT_MAX_SLICE (no cluster plans), never without it or above m = 8; the pins keep it only as
    tuned: a pinned BM 16 or a pinned split makes it plain, CUDA_EXL3_LOHI=1 keeps it, CUDA_EXL3_LOHI=0 makes it the
    plain BM 16 GEMM, and a pinned BM 8 over a BM 16 fused plan gives the unfused BM 8 lohi plan."""
    from exl3_kernels import autotune
    from exl3_kernels.plan import FUSED_IT_MAX_SLICE, SWAP_BM, candidate_splits, fused_it_slice

    for v in ("PATH", "BM", "SPLIT", "LOHI"):
        monkeypatch.delenv(f"CUDA_EXL3_{v}", raising=False)
    shape = LayerShape(4096, (11008,), (8,), 1)
    for m in (1, 4, 8):
        plain = candidates(shape, m, 132, ACC, lohi_bm=(8, 16), fused_it=True)
        with_f = candidates(shape, m, 132, ACC, lohi_bm=(8, 16), fused_it=True, fused_swap=True)
        fs = [p for p in with_f if p.bm == SWAP_BM and p.fused_it]
        assert [p for p in with_f if p not in fs] == plain
        fit = [s for s in candidate_splits(shape, m, SWAP_BM, 132, ACC) if fused_it_slice(4096, s) <= FUSED_IT_MAX_SLICE]
        assert fit and [p.split for p in fs] == fit, (m, fs)
        assert all(p.lohi and not p.cluster for p in fs)
        assert not [p for p in plain if p.bm == SWAP_BM and p.fused_it]
    assert not [p for p in candidates(shape, 16, 132, ACC, lohi_bm=(8, 16), fused_it=True, fused_swap=True)
                if p.bm == SWAP_BM]
    assert not [p for p in candidates(shape, 1, 132, ACC, lohi_bm=(16,), fused_it=True, fused_swap=True)
                if p.bm == SWAP_BM]  # no BM 8 instance
    built = (16, 32, 64, 128)
    f8 = Plan("gemm", 8, 4, lohi=True, fused_it=True)
    assert autotune._apply_pins(f8, (8, 16), built) == f8
    assert str(f8) == "gemm(bm=8,split=4,lohi,it)"
    monkeypatch.setenv("CUDA_EXL3_LOHI", "1")
    assert autotune._apply_pins(f8, (8, 16), built) == f8
    monkeypatch.setenv("CUDA_EXL3_LOHI", "0")
    assert autotune._apply_pins(f8, (8, 16), built) == Plan("gemm", 16, 4)
    monkeypatch.delenv("CUDA_EXL3_LOHI")
    monkeypatch.setenv("CUDA_EXL3_BM", "16")
    assert autotune._apply_pins(f8, (8, 16), built) == Plan("gemm", 16, 4, lohi=True)
    monkeypatch.setenv("CUDA_EXL3_BM", "8")
    assert autotune._apply_pins(Plan("gemm", 16, 4, fused_it=True), (8, 16), built) == Plan("gemm", 8, 4, lohi=True)
    monkeypatch.setenv("CUDA_EXL3_BM", "32")  # no BM 32 lohi instance: the plain BM 32 GEMM (review of 7ae5bc7)
    assert autotune._apply_pins(Plan("gemm", 8, 4, lohi=True), (8, 16), built) == Plan("gemm", 32, 4)
    assert autotune._apply_pins(f8, (8, 16), built) == Plan("gemm", 32, 4)
    monkeypatch.delenv("CUDA_EXL3_BM")
    monkeypatch.setenv("CUDA_EXL3_SPLIT", "2")
    assert autotune._apply_pins(f8, (8, 16), built) == Plan("gemm", 8, 2, lohi=True)

def test_wgmma_candidates_only_when_usable_and_from_m_128():
    """The wgmma GEMM is a candidate only when the caller says it is usable (built for the codebook, device of compute
    capability 9.0) and m >= WGMMA_MIN_M; always BM 256, with split 1 plus the splits the rules allow for a BM 256
    grid at one block per SM; deterministic mode keeps split 1 only. The other candidates do not change."""
    from exl3_kernels.plan import WGMMA_BM, WGMMA_MIN_M, candidate_splits

    assert WGMMA_MIN_M == 128 and WGMMA_BM == 256 and BLOCKS_PER_SM[WGMMA_BM] == 1
    for shape in SHAPES:
        for m in (1, 64, 127, 128, 129, 256, 300, 1000, 4096):
            base = candidates(shape, m, 132, ACC)
            with_w = candidates(shape, m, 132, ACC, wgmma=True)
            extra = [p for p in with_w if p not in base]
            assert [p for p in with_w if p.path != "wgmma"] == base
            if m < WGMMA_MIN_M:
                assert not extra, (shape, m)
                continue
            assert extra and all(p.path == "wgmma" and p.bm == WGMMA_BM and not p.lohi for p in extra)
            splits = [p.split for p in extra]
            assert splits[0] == 1 and splits == candidate_splits(shape, m, WGMMA_BM, 132, ACC)
            assert all(1 <= s <= max_split(shape) and splitk_allowed(shape, m, s, ACC) for s in splits)
            det = [p for p in candidates(shape, m, 132, ACC, deterministic=True, wgmma=True) if p.path == "wgmma"]
            assert det == [Plan("wgmma", WGMMA_BM, 1)]
    assert str(Plan("wgmma", 256, 3)) == "wgmma(split=3)"


def test_wgmma_splits_fill_waves_of_one_block_per_sm():
    """4096x11008 at m = 128..256 has 86 BM 256 blocks: below one wave of 132, so whole-wave splits are offered."""
    from exl3_kernels.plan import WGMMA_BM, candidate_splits

    shape = SHAPES[0]
    splits = candidate_splits(shape, 256, WGMMA_BM, 132, ACC)
    waves = wave_splits(shape, 256, WGMMA_BM, 132)
    assert waves == [3, 4, 6]  # 2, 3, 4 waves of 132: 264 // 86, 396 // 86, 528 // 86
    assert set(w for w in waves if splitk_allowed(shape, 256, w, ACC)) <= set(splits)


def test_cost_model_never_picks_wgmma():
    for shape in SHAPES:
        for m in (1, 128, 256, 512, 1023, 1024, 4096):
            for det in (False, True):
                assert cost_model(shape, m, 132, ACC, deterministic=det).path != "wgmma"


def test_wgmma_path_pin(monkeypatch):
    """CUDA_EXL3_PATH=wgmma: BM 256, lohi off, the plan's split kept (or CUDA_EXL3_SPLIT), CUDA_EXL3_BM ignored;
    CUDA_EXL3_PATH=gemm over a tuned wgmma plan takes the largest mma.sync tier of the build."""
    from exl3_kernels import autotune

    for v in ("PATH", "BM", "SPLIT", "LOHI"):
        monkeypatch.delenv(f"CUDA_EXL3_{v}", raising=False)
    monkeypatch.setenv("CUDA_EXL3_PATH", "wgmma")
    assert autotune._apply_pins(Plan("gemm", 16, 4, lohi=True), (16,)) == Plan("wgmma", 256, 4)
    assert autotune._apply_pins(Plan("reconstruct")) == Plan("wgmma", 256, 1)
    monkeypatch.setenv("CUDA_EXL3_BM", "64")
    monkeypatch.setenv("CUDA_EXL3_SPLIT", "2")
    assert autotune._apply_pins(Plan("gemm", 128, 1)) == Plan("wgmma", 256, 2)
    monkeypatch.setenv("CUDA_EXL3_PATH", "gemm")
    monkeypatch.delenv("CUDA_EXL3_BM")
    assert autotune._apply_pins(Plan("wgmma", 256, 3)) == Plan("gemm", 128, 2)
    # the largest tier of the build, e.g. the CI's reduced build with BM 16 and 64 only
    assert autotune._apply_pins(Plan("wgmma", 256, 3), (), (16, 64)) == Plan("gemm", 64, 2)
    monkeypatch.setenv("CUDA_EXL3_BM", "32")
    assert autotune._apply_pins(Plan("wgmma", 256, 3)) == Plan("gemm", 32, 2)


def test_autotune_offers_wgmma_only_when_usable_and_capture_keeps_the_cost_model(monkeypatch):
    """choose() forwards ``wgmma`` to the candidates (timed like any other and chosen when fastest); under capture
    an untuned bucket gets the cost model (never wgmma), a tuned one keeps its wgmma plan."""
    from exl3_kernels import autotune

    for v in ("DETERMINISTIC", "AUTOTUNE", "PATH", "BM", "SPLIT", "LOHI"):
        monkeypatch.delenv(f"CUDA_EXL3_{v}", raising=False)
    capturing = [False]
    monkeypatch.setattr(autotune.torch.cuda, "is_current_stream_capturing", lambda: capturing[0])
    monkeypatch.setattr(autotune, "sm_count", lambda device: 132)
    timed: list[Plan] = []
    last: list[Plan] = []

    def fake_time(fn, device, reps=5, graph=False):
        fn()
        timed.append(last[-1])
        return 0.05 if last[-1].path == "wgmma" else 0.1

    monkeypatch.setattr(autotune, "_time", fake_time)
    shape, dev = LayerShape(4096, (11008,), (8,), 1), torch.device("cpu")
    autotune.clear()
    p = autotune.choose(shape, 256, torch.float16, dev, ACC, (16, 32, 64, 128), last.append)
    assert p.path != "wgmma" and not any(c.path == "wgmma" for c in timed)
    autotune.clear()
    timed.clear()
    p = autotune.choose(shape, 256, torch.float16, dev, ACC, (16, 32, 64, 128), last.append, wgmma=True)
    assert p.path == "wgmma" and any(c.path == "wgmma" for c in timed)
    capturing[0] = True
    assert autotune.choose(shape, 200, torch.float16, dev, ACC, (16, 32, 64, 128), last.append, wgmma=True) == p
    q = autotune.choose(shape, 600, torch.float16, dev, ACC, (16, 32, 64, 128), last.append, wgmma=True)
    assert q == cost_model(shape, 600, 132, ACC) and q.path != "wgmma"
    autotune.clear()


def test_wgmma_constants_match_the_kernel():
    """plan.WGMMA_BM and BLOCKS_PER_SM[256] are the planner's copies of csrc/gemm_sm90/wgmma_gemm.cu's block tile and
    its one-block-per-SM launch bounds; setup.py builds that TU for sm_90a only, with the stub otherwise."""
    import re
    from pathlib import Path

    from exl3_kernels.plan import WGMMA_BM

    root = Path(__file__).resolve().parents[1]
    src = (root / "csrc" / "gemm_sm90" / "wgmma_gemm.cu").read_text()
    assert int(re.search(r"constexpr int kBM = (\d+)", src).group(1)) == WGMMA_BM
    assert "__launch_bounds__(kThreads, 1)" in src and BLOCKS_PER_SM[WGMMA_BM] == 1
    setup = (root / "setup.py").read_text()
    assert "-gencode=arch=compute_90a,code=sm_90a" in setup and "wgmma_stub.cpp" in setup


def test_wgmma_not_usable_off_gpu():
    from exl3_kernels import _ops

    assert _ops.wgmma_usable("cpu", 1) is False
    assert _ops.wgmma_built() in (True, False)


def test_wgmma_candidates_on_by_default(monkeypatch):
    """The autotuner is offered the wgmma GEMM where it is usable (built for the codebook, compute capability 9.0),
    unless CUDA_EXL3_WGMMA=0."""
    import torch

    from exl3_kernels import _ops, linear

    monkeypatch.setattr(_ops, "wgmma_usable", lambda device, cb: cb == 1)
    monkeypatch.delenv("CUDA_EXL3_WGMMA", raising=False)
    dev = torch.device("cuda", 0)
    assert linear.wgmma_offered(dev, 1)
    assert not linear.wgmma_offered(dev, 2)
    monkeypatch.setenv("CUDA_EXL3_WGMMA", "1")
    assert linear.wgmma_offered(dev, 1)
    assert not linear.wgmma_offered(dev, 2)
    monkeypatch.setenv("CUDA_EXL3_WGMMA", "0")
    assert not linear.wgmma_offered(dev, 1)


def test_deterministic_split_k_only_through_clusters():
    """Deterministic mode: split 1 without the cluster reduction; with it (cluster_splitk) a cluster plan whose grid
    fills at most one wave of resident blocks, capped at the portable cluster size (8), whatever the accumulator's size
    (a cluster never touches it). 4096x11008 at m = 64 (BM64, 86 blocks, 396 resident): split 4, where the cost model with atomics
    picks the two-wave split 9 (the deterministic cluster plan of 96288fb, 45.6 us against 33.2 at split 4)."""
    from exl3_kernels.plan import CLUSTER_PLAN_MAX_SPLIT

    for ns in ([11008], [4096], [5120], [4096, 1024, 1024], [17408]):
        shape = LayerShape(4096, tuple(ns), tuple(8 for _ in ns), 1)
        assert cost_model(shape, 1, 132, ACC, deterministic=True) == Plan("gemm", 16, 1)
        p = cost_model(shape, 1, 132, ACC, deterministic=True, cluster_splitk=True)
        assert p.path == "gemm" and p.cluster and 2 <= p.split <= CLUSTER_PLAN_MAX_SPLIT, (ns, p)
        blocks = sum(ns) // 128
        assert blocks * p.split <= BLOCKS_PER_SM[16] * 132 < blocks * (p.split + 1) or p.split == 8, (ns, p)
        # a cluster leaves the accumulator untouched and the op does not check its size for one: no room, same plan
        assert cost_model(shape, 1, 132, 0, deterministic=True, cluster_splitk=True) == p
        assert cost_model(shape, 1, 132, 0).split == 1  # the atomic path needs the accumulator too
    mid = LayerShape(4096, (11008,), (8,), 1)
    assert cost_model(mid, 64, 132, ACC).split == 9
    assert cost_model(mid, 64, 132, ACC, deterministic=True, cluster_splitk=True) == Plan("gemm", 64, 4, cluster=True)
    # a grid that already fills the GPU stays at split 1, without the cluster flag
    wide = LayerShape(4096, (28672 * 4,), (8,), 1)
    assert cost_model(wide, 64, 132, ACC, deterministic=True, cluster_splitk=True) == Plan("gemm", 64, 1)


def test_cluster_candidates_only_where_measured_useful():
    """The autotuner times cluster plans only with cluster_splitk, outside deterministic mode, for m = 32..256, at
    splits 2..8 within max_split; str() marks them."""
    from exl3_kernels.plan import CLUSTER_MAX_M, CLUSTER_MIN_M, CLUSTER_PLAN_MAX_SPLIT

    shape = LayerShape(4096, (11008,), (8,), 1)
    for m in (1, 16, 32, 64, 256, 512):
        plain = candidates(shape, m, 132, ACC)
        with_c = candidates(shape, m, 132, ACC, cluster_splitk=True)
        assert not any(p.cluster for p in plain)
        cl = [p for p in with_c if p.cluster]
        assert [p for p in with_c if not p.cluster] == plain
        if CLUSTER_MIN_M <= m <= CLUSTER_MAX_M:
            assert cl and all(p.path == "gemm" and 2 <= p.split <= CLUSTER_PLAN_MAX_SPLIT and not p.lohi for p in cl)
            assert Plan("gemm", 64, 4, cluster=True) in cl or m != 64
        else:
            assert not cl, (m, cl)
        assert not any(p.cluster for p in candidates(shape, m, 132, ACC, deterministic=True, cluster_splitk=True))
    short = LayerShape(512, (11008,), (8,), 1)  # max_split 2
    assert {p.split for p in candidates(short, 64, 132, ACC, cluster_splitk=True) if p.cluster} == {2}
    assert str(Plan("gemm", 64, 4, cluster=True)) == "gemm(bm=64,split=4,cluster)"


def test_cluster_mode_and_split_pin(monkeypatch):
    """CUDA_EXL3_CLUSTER is three-valued (unset: the plan decides; 1 / 0) and part of the plan cache key; a pinned
    split outside 2..16 drops the cluster flag (the kernel reduces in clusters of at most 16 blocks)."""
    from exl3_kernels import autotune

    monkeypatch.delenv("CUDA_EXL3_CLUSTER", raising=False)
    monkeypatch.delenv("VLLM_EXL3_CLUSTER", raising=False)
    shape = LayerShape(4096, (11008,), (8,), 1)
    keys = []
    for val, mode in ((None, None), ("1", True), ("0", False)):
        if val is not None:
            monkeypatch.setenv("CUDA_EXL3_CLUSTER", val)
        assert autotune.cluster_mode() is mode
        keys.append(autotune._key(shape, 64, torch.float16, torch.device("cpu"), False))
    assert len(set(keys)) == 3
    monkeypatch.setenv("CUDA_EXL3_SPLIT", "32")
    assert autotune._apply_pins(Plan("gemm", 64, 4, cluster=True)) == Plan("gemm", 64, 32)
    monkeypatch.setenv("CUDA_EXL3_SPLIT", "6")
    assert autotune._apply_pins(Plan("gemm", 64, 4, cluster=True)) == Plan("gemm", 64, 6, cluster=True)


def test_fused_it_slices_and_candidates():
    """The GEMM with the input transform inside: slices are ceil(k / split) rounded up to 128 columns (ops.cpp's
    rule); its BM16 plans are offered only with ``fused_it``, for m <= FUSED_IT_MAX_M, outside deterministic mode, at
    splits whose slice fits 1024 columns (cluster variants only with cluster_splitk, at most 8)."""
    from exl3_kernels.plan import FUSED_IT_MAX_M, FUSED_IT_MAX_SLICE, fused_it_slice

    assert fused_it_slice(4096, 4) == 1024 and fused_it_slice(4096, 6) == 768 and fused_it_slice(640, 4) == 256
    assert fused_it_slice(4096, 3) == 1408 and fused_it_slice(17408, 17) == 1024 and fused_it_slice(17408, 16) == 1152
    for k, n in ((4096, 11008), (4096, 4096), (17408, 5120), (1024, 2048)):
        shape = LayerShape(k, (n,), (8,), 1)
        for m in (1, 4, 16, 32):
            plain = candidates(shape, m, 132, ACC)
            assert not any(p.fused_it for p in plain)
            fx = [p for p in candidates(shape, m, 132, ACC, fused_it=True) if p.fused_it]
            fxc = [p for p in candidates(shape, m, 132, ACC, cluster_splitk=True, fused_it=True) if p.fused_it]
            if m > FUSED_IT_MAX_M:
                assert not fx and not fxc
                continue
            assert fx and all(p.bm == 16 and not p.lohi and not p.cluster for p in fx), (k, n, m, fx)
            assert all(fused_it_slice(k, p.split) <= FUSED_IT_MAX_SLICE for p in fx + fxc)
            assert {p for p in fxc if not p.cluster} == set(fx)
            cl = [p for p in fxc if p.cluster]
            assert (bool(cl) == (k <= 8 * 1024)) and all(2 <= p.split <= 8 for p in cl), (k, n, m, fxc)
            assert not any(p.fused_it for p in candidates(shape, m, 132, ACC, deterministic=True, fused_it=True))
    # k = 1024 fits at split 1; 4096 needs split >= 4; 17408 split >= 17 (no cluster split <= 8 fits: none offered)
    assert Plan("gemm", 16, 1, fused_it=True) in candidates(LayerShape(1024, (2048,), (8,), 1), 1, 132, ACC, fused_it=True)
    big = [p for p in candidates(LayerShape(17408, (5120,), (8,), 1), 1, 132, ACC, cluster_splitk=True, fused_it=True)
           if p.fused_it]
    assert big and all(p.split >= 17 and not p.cluster for p in big)
    assert str(Plan("gemm", 16, 4, cluster=True, fused_it=True)) == "gemm(bm=16,split=4,cluster,it)"


def test_fused_it_pins(monkeypatch):
    """A pinned split, or a pinned BM other than 16, turns the plan back into a plain GEMM plan (the fused slice limit
    is not known to the pin); CUDA_EXL3_LOHI=1 replaces a fused plan by the lohi one where the layer has a lohi
    instance; CUDA_EXL3_FUSED_IT is part of the cache key."""
    from exl3_kernels import autotune

    p = Plan("gemm", 16, 4, fused_it=True)
    monkeypatch.setenv("CUDA_EXL3_LOHI", "1")
    assert autotune._apply_pins(p, (16,)) == Plan("gemm", 16, 4, lohi=True)  # LOHI=1 means lohi: the plain GEMM's
    assert autotune._apply_pins(p, ()) == p  # no lohi instance (mul1): the fused plan stays
    monkeypatch.delenv("CUDA_EXL3_LOHI")
    monkeypatch.setenv("CUDA_EXL3_BM", "32")
    assert autotune._apply_pins(p) == Plan("gemm", 32, 4)
    monkeypatch.setenv("CUDA_EXL3_BM", "16")
    assert autotune._apply_pins(p) == p
    monkeypatch.delenv("CUDA_EXL3_BM")
    monkeypatch.setenv("CUDA_EXL3_SPLIT", "2")
    assert autotune._apply_pins(p) == Plan("gemm", 16, 2)
    monkeypatch.delenv("CUDA_EXL3_SPLIT")
    shape = LayerShape(4096, (11008,), (8,), 1)
    k1 = autotune._key(shape, 1, torch.float16, torch.device("cpu"), False)
    monkeypatch.setenv("CUDA_EXL3_FUSED_IT", "0")
    assert autotune._key(shape, 1, torch.float16, torch.device("cpu"), False) != k1
    monkeypatch.delenv("CUDA_EXL3_FUSED_IT")
    assert autotune._key(shape, 1, torch.float16, torch.device("cpu"), False) == k1
    for var, value in (("WGMMA", "0"), ("PDL", "0"), ("SPREAD", "0"), ("SPLITK_WORKSPACE_MB", "8"), ("RECON_MIN_M", "256")):
        monkeypatch.setenv("CUDA_EXL3_" + var, value)
        assert autotune._key(shape, 1, torch.float16, torch.device("cpu"), False) != k1, var
        monkeypatch.delenv("CUDA_EXL3_" + var)


def test_cluster_plans_need_no_accumulator():
    """A cluster launch never touches the accumulator and the op does not check its size for one, so layers wider than
    the workspace get cluster plans: the lm_head (k 4096, n 128256) at m = 256 (32.8 M outputs against the 16.8 M
    elements of the default workspace; vLLM's profile run primes it, and before the op skipped the check that failed
    the engine's start at 38941ac). Plans through the accumulator (split > 1 without ``cluster``) must still fit it."""
    acc = 16 << 20
    head = LayerShape(4096, (128256,), (12,), 1)
    for m in (1, 16, 32, 64, 128, 256):
        fits = m_bucket(m) * 128256 <= acc
        for p in candidates(head, m, 132, acc, cluster_splitk=True, fused_it=True):
            if p.split > 1 and not p.cluster:
                assert fits, (m, p)
        det = cost_model(head, m, 132, acc, deterministic=True, cluster_splitk=True)
        assert det.split == 1 or det.cluster, (m, det)
    assert any(p.cluster for p in candidates(head, 256, 132, acc, cluster_splitk=True))
    assert not any(p.split > 1 and not p.cluster for p in candidates(head, 256, 132, acc, cluster_splitk=True))
    # deterministic mode's cluster split does not depend on the workspace: 4096x4096 at m = 1 (32 BM16 blocks) with
    # room for only 1024 outputs still gets split 8 through a cluster (it ran split 1 when the op checked the size)
    sq = LayerShape(4096, (4096,), (4,), 1)
    assert cost_model(sq, 1, 132, 1 << 10, deterministic=True, cluster_splitk=True) == Plan("gemm", 16, 8, cluster=True)


def test_deterministic_cluster_split_is_a_power_of_two_at_bm128():
    """Deterministic mode's cluster split: the largest that keeps the grid within one wave, rounded down to a power of two
    for BM128 (split 5 and 6 clusters measured slower than 4 at m = 128, plan.DET_CLUSTER_POW2_MIN_BM); the smaller
    tiers keep the one-wave split even where it is not a power of two."""
    qkv = LayerShape(4096, (4096, 1024, 1024), (8, 10, 10), 1)
    deep = LayerShape(17408, (5120,), (8,), 1)
    for shape in (qkv, deep):
        for m in (65, 100, 128):  # bucket 128: BM128, one-wave split 5 (qkv: 48 blocks) or 6 (40 blocks) -> 4
            one_wave = BLOCKS_PER_SM[128] * 132 // (shape.n_total // 128)
            assert one_wave in (5, 6)
            p = cost_model(shape, m, 132, ACC, deterministic=True, cluster_splitk=True)
            assert p == Plan("gemm", 128, 4, cluster=True), (shape, m, p)
    # BM16 / BM32 / BM64 keep a one-wave split that is not a power of two (6 here: 80 or 64 column blocks)
    for n, m, bm in ((10240, 1, 16), (8192, 32, 32), (8192, 64, 64)):
        shape = LayerShape(4096, (n,), (8,), 1)
        one_wave = BLOCKS_PER_SM[bm] * 132 // (n // 128 * math.ceil(m / bm))
        p = cost_model(shape, m, 132, ACC, deterministic=True, cluster_splitk=True)
        assert p == Plan("gemm", bm, 6, cluster=True) and one_wave == 6, (n, m, p, one_wave)


def test_deterministic_mode_dense_path_by_m():
    """Deterministic mode (no timing) plans by m bucket (the same plan whichever m of the bucket came first): the
    buckets 256 and 512 (plan.DET_RECON_N_MIN_M) take reconstruct_n for one-shard layers and reconstruct for fused
    ones (reconstruct_n runs a cuBLAS GEMM per shard), reconstruct from bucket 1024 (plan.DET_RECON_MAX_M), the GEMM
    below (bucket 128 and less); the timed mode's fallback is unchanged."""
    for ns in ([11008], [4096], [4096, 1024, 1024], [5120]):
        shape = LayerShape(4096, tuple(ns), tuple(8 for _ in ns), 1)
        dense_small = "reconstruct_n" if len(ns) == 1 else "reconstruct"
        for m, path in ((64, "gemm"), (128, "gemm"), (129, dense_small), (256, dense_small), (257, dense_small),
                        (511, dense_small), (512, dense_small), (513, "reconstruct"), (1024, "reconstruct"),
                        (2048, "reconstruct"), (4096, "reconstruct"), (8192, "reconstruct")):
            for cl in (False, True):
                assert cost_model(shape, m, 132, ACC, deterministic=True, cluster_splitk=cl).path == path, (ns, m, cl)
        assert cost_model(shape, 512, 132, ACC).path == "gemm"
        assert cost_model(shape, 1024, 132, ACC).path == "reconstruct"


def test_pins_keep_deterministic_mode_free_of_atomics(monkeypatch):
    """Review finding: CUDA_EXL3_PATH=wgmma over a deterministic cluster plan made wgmma(split=8), which reduces through
    the atomic accumulator; a pinned split on a split-1 plan did the same. In deterministic mode a pinned gemm split
    2..16 reduces in a cluster (where available), anything else falls back to split 1."""
    from exl3_kernels import autotune

    monkeypatch.setenv("CUDA_EXL3_DETERMINISTIC", "1")
    det = Plan("gemm", 16, 8, cluster=True)
    monkeypatch.setenv("CUDA_EXL3_PATH", "wgmma")
    assert autotune._apply_pins(det, cluster_splitk=True) == Plan("wgmma", 256, 1)
    monkeypatch.delenv("CUDA_EXL3_PATH")
    monkeypatch.setenv("CUDA_EXL3_SPLIT", "4")
    assert autotune._apply_pins(Plan("gemm", 16, 1), cluster_splitk=True) == Plan("gemm", 16, 4, cluster=True)
    assert autotune._apply_pins(Plan("gemm", 16, 1), cluster_splitk=False) == Plan("gemm", 16, 1)
    monkeypatch.setenv("CUDA_EXL3_SPLIT", "32")
    assert autotune._apply_pins(Plan("gemm", 16, 1), cluster_splitk=True) == Plan("gemm", 16, 1)
    monkeypatch.delenv("CUDA_EXL3_DETERMINISTIC")  # the timed mode keeps what was pinned
    assert autotune._apply_pins(Plan("gemm", 16, 1), cluster_splitk=True) == Plan("gemm", 16, 32)


def test_accumulator_rules_hold_for_the_whole_bucket():
    """Review finding: a bucket first tuned at m = 130 (m x n fits) offered split-k that m = 200 of the same bucket (256)
    could not hold, and the op refused the later call. The capacity rules use the bucket's largest m."""
    acc = 16 << 20
    head = LayerShape(4096, (128256,), (12,), 1)  # 130 x 128256 = 16.67 M fits, 256 x 128256 = 32.8 M does not
    assert not splitk_allowed(head, 130, 2, acc)
    assert not any(p.split > 1 and not p.cluster
                   for p in candidates(head, 130, 132, acc, cluster_splitk=True, fused_it=True) if p.path in ("gemm", "wgmma"))


def test_deterministic_mode_wgmma_rule():
    """Deterministic mode takes the wgmma GEMM at split 1 for the buckets 128 and 256 where the device has it and the
    layer has at least half an output tile per SM (plan.DET_WGMMA_MIN_TILES_PER_SM; the fastest deterministic candidate
    on 4096x11008 and 5120x12288 in gemm-38941ac-k4.json); narrower layers, other buckets and the timed mode's fallback
    are unchanged."""
    wide = [LayerShape(4096, (11008,), (8,), 1), LayerShape(5120, (12288,), (8,), 1), LayerShape(4096, (128256,), (12,), 1)]
    narrow = [LayerShape(17408, (5120,), (8,), 1), LayerShape(4096, (4096,), (8,), 1),
              LayerShape(4096, (4096, 1024, 1024), (8, 10, 10), 1)]
    for shape in wide:
        for m in (65, 128, 129, 256):
            assert cost_model(shape, m, 132, ACC, deterministic=True, cluster_splitk=True, wgmma=True) == \
                Plan("wgmma", 256, 1), (shape, m)
            assert cost_model(shape, m, 132, ACC, deterministic=True, cluster_splitk=True).path == \
                ("gemm" if m <= 128 else "reconstruct_n")  # without wgmma: bucket 256 is a dense path's
            assert cost_model(shape, m, 132, ACC, wgmma=True).path == "gemm"  # timed mode's fallback
        for m in (64, 257, 512):
            assert cost_model(shape, m, 132, ACC, deterministic=True, wgmma=True).path != "wgmma", (shape, m)
    for shape in narrow:  # bucket 128 keeps the GEMM, bucket 256 the dense paths
        assert cost_model(shape, 128, 132, ACC, deterministic=True, wgmma=True).path == "gemm", shape
        assert cost_model(shape, 256, 132, ACC, deterministic=True, wgmma=True).path in ("reconstruct_n", "reconstruct")
    # a lowered CUDA_EXL3_RECON_MIN_M still wins over the rule (as in the timed mode's fallback)
    assert cost_model(wide[0], 200, 132, ACC, recon_min_m=128, deterministic=True, wgmma=True) == Plan("reconstruct")
    # the threshold: 66 tiles on 132 SMs qualify, 65 do not
    assert cost_model(LayerShape(4096, (66 * 128,), (8,), 1), 200, 132, ACC, deterministic=True, wgmma=True).path == "wgmma"
    assert cost_model(LayerShape(4096, (65 * 128,), (8,), 1), 200, 132, ACC, deterministic=True, wgmma=True).path == \
        "reconstruct_n"
    assert cost_model(LayerShape(4096, (65 * 128,), (8,), 1), 100, 132, ACC, deterministic=True, wgmma=True).path == "gemm"


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("m", [1, 3, 8, 16, 17, 64, 100, 128, 256])
def test_rs_plans_tiers_splits_and_accumulator(shape, m):
    """The register-A wgmma plans: offered only with ``wgmma_rs``, outside deterministic mode and up to RS_MAX_M; BM the
    RS tier covering m and those >= m / 2 below it; split 1 always (when the accumulator holds the bucket), every split
    within max_split and the accumulator traffic rule; none when the accumulator is too small for the bucket."""
    from exl3_kernels.plan import RS_BM_TIERS, RS_MAX_M, rs_plans

    plans = rs_plans(shape, m, 132, ACC)
    assert plans and all(p.path == "wgmma_rs" for p in plans)
    expected = {1: {8}, 3: {8}, 8: {8}, 16: {8, 16}, 17: {16, 32}, 64: {32, 64}, 100: {64, 128}, 128: {64, 128},
                256: {128}}
    assert {p.bm for p in plans} == expected[m]
    for bm in {p.bm for p in plans}:
        assert Plan("wgmma_rs", bm, 1) in plans
    for p in plans:
        assert 1 <= p.split <= max_split(shape) and (p.split == 1 or splitk_allowed(shape, m, p.split, ACC))
    assert rs_plans(shape, m, 132, m_bucket(m) * shape.n_total - 1) == []
    assert not any(c.path == "wgmma_rs" for c in candidates(shape, m, 132, ACC))
    with_rs = candidates(shape, m, 132, ACC, wgmma_rs=True)
    assert [c for c in with_rs if c.path == "wgmma_rs"] == plans
    assert not any(c.path == "wgmma_rs" for c in candidates(shape, m, 132, ACC, deterministic=True, wgmma_rs=True))
    assert rs_plans(shape, RS_MAX_M + 1, 132, 1 << 40) == []
    assert str(Plan("wgmma_rs", 32, 4)) == "wgmma_rs(bm=32,split=4)"


def test_rs_pins_and_kernel_count(monkeypatch):
    """CUDA_EXL3_PATH=wgmma_rs keeps an RS tier BM (else the largest), CUDA_EXL3_BM applies only with an RS tier,
    deterministic mode turns a pinned split into 1; one call is three kernels at every split with the split-k epilogue
    kernel (CUDA_EXL3_SPLITK_FINISH=0; two with the GEMM's own finish, test_kernel_count_with_the_split_k_finish_in_the_gemm)."""
    from exl3_kernels import autotune
    from exl3_kernels.autotune import kernel_count

    for v in ("PATH", "BM", "SPLIT", "LOHI", "DETERMINISTIC"):
        monkeypatch.delenv(f"CUDA_EXL3_{v}", raising=False)
    monkeypatch.setenv("CUDA_EXL3_SPLITK_FINISH", "0")
    monkeypatch.setenv("CUDA_EXL3_PATH", "wgmma_rs")
    assert autotune._apply_pins(Plan("gemm", 32, 4)) == Plan("wgmma_rs", 32, 4)
    assert autotune._apply_pins(Plan("wgmma", 256, 2)) == Plan("wgmma_rs", 128, 2)
    assert autotune._apply_pins(Plan("gemm", 16, 8, fused_it=True, cluster=True)) == Plan("wgmma_rs", 16, 8)
    monkeypatch.setenv("CUDA_EXL3_BM", "8")
    assert autotune._apply_pins(Plan("gemm", 64, 1)) == Plan("wgmma_rs", 8, 1)
    monkeypatch.setenv("CUDA_EXL3_BM", "48")
    assert autotune._apply_pins(Plan("gemm", 64, 1)).bm == 64
    monkeypatch.delenv("CUDA_EXL3_BM")
    monkeypatch.setenv("CUDA_EXL3_SPLIT", "6")
    monkeypatch.setenv("CUDA_EXL3_DETERMINISTIC", "1")
    assert autotune._apply_pins(Plan("gemm", 64, 1)) == Plan("wgmma_rs", 64, 1)
    monkeypatch.delenv("CUDA_EXL3_DETERMINISTIC")
    assert autotune._apply_pins(Plan("gemm", 64, 1)) == Plan("wgmma_rs", 64, 6)
    monkeypatch.setenv("CUDA_EXL3_PATH", "gemm")
    monkeypatch.delenv("CUDA_EXL3_SPLIT")
    assert autotune._apply_pins(Plan("wgmma_rs", 8, 3)) == Plan("gemm", 128, 3)
    for split in (1, 4):
        assert kernel_count(Plan("wgmma_rs", 64, split)) == 3


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("m", [16, 17, 32, 64, 100, 128, 256])
def test_rs_cluster_plans(shape, m):
    """With ``cluster`` the register-A plans add, for m in [CLUSTER_MIN_M, CLUSTER_MAX_M] only, the cluster plans of
    the same BM tiers at cluster_splits with the register-A kernel's resident blocks (RS_BLOCKS_PER_SM) up to
    those in RS_CLUSTER_SPLITS (2 and 4; never the one-wave fit 3), no
    accumulator needed, so they stay where the accumulator cannot hold the bucket; candidates() passes its
    cluster_splitk on; shown with ",cluster"."""
    from exl3_kernels.plan import (CLUSTER_MAX_M, CLUSTER_MIN_M, RS_BLOCKS_PER_SM, RS_CLUSTER_SPLITS,
                                   cluster_splits, rs_plans)

    plain = rs_plans(shape, m, 132, ACC)
    both = rs_plans(shape, m, 132, ACC, cluster=True)
    cl = [p for p in both if p.cluster]
    assert [p for p in both if not p.cluster] == plain
    if not CLUSTER_MIN_M <= m <= CLUSTER_MAX_M:
        assert cl == []
        return
    assert cl and {p.bm for p in cl} == {p.bm for p in plain}
    for bm in {p.bm for p in cl}:
        assert sorted(p.split for p in cl if p.bm == bm) == [
            s for s in cluster_splits(shape, m, bm, 132, ACC, RS_BLOCKS_PER_SM) if s in RS_CLUSTER_SPLITS]
    assert RS_CLUSTER_SPLITS == (2, 4) and {p.split for p in cl} <= {2, 4}
    if shape == SHAPES[0] and m == 64:  # the one-wave fit of BM 64 is split 3 here, which the register-A form skips
        assert 3 in cluster_splits(shape, m, 64, 132, ACC, RS_BLOCKS_PER_SM)
        assert sorted(p.split for p in cl if p.bm == 64) == [2, 4]
    assert all(p.split <= max_split(shape) and p.path == "wgmma_rs" for p in cl)
    assert [p for p in rs_plans(shape, m, 132, 1, cluster=True)] == cl  # no accumulator: only the cluster plans
    with_cl = candidates(shape, m, 132, ACC, wgmma_rs=True, cluster_splitk=True)
    assert all(p in with_cl for p in cl)
    assert not any(p.path == "wgmma_rs" and p.cluster for p in candidates(shape, m, 132, ACC, wgmma_rs=True))
    assert str(Plan("wgmma_rs", 64, 8, cluster=True)) == "wgmma_rs(bm=64,split=8,cluster)"


def test_rs_cluster_pins_and_kernel_count(monkeypatch):
    """A register-A cluster plan is two kernels (input transform, GEMM) at every m; CUDA_EXL3_PATH=wgmma_rs keeps the
    cluster flag of a tuned wgmma_rs plan and drops that of an mma.sync cluster plan; deterministic mode turns a pinned
    wgmma_rs split into a cluster plan where the library's register-A GEMM has the form, else into split 1; the
    autotuner drops register-A cluster candidates for a library without it and with CUDA_EXL3_WGMMA_RS_CLUSTER=0."""
    from exl3_kernels import _ops, autotune
    from exl3_kernels.autotune import kernel_count

    for v in ("PATH", "BM", "SPLIT", "LOHI", "DETERMINISTIC"):
        monkeypatch.delenv(f"CUDA_EXL3_{v}", raising=False)
    monkeypatch.setenv("CUDA_EXL3_SPLITK_FINISH", "0")
    assert kernel_count(Plan("wgmma_rs", 64, 8, cluster=True), m=64) == 2
    assert kernel_count(Plan("wgmma_rs", 64, 8), m=64) == 3
    monkeypatch.setenv("CUDA_EXL3_PATH", "wgmma_rs")
    assert autotune._apply_pins(Plan("wgmma_rs", 64, 4, cluster=True)) == Plan("wgmma_rs", 64, 4, cluster=True)
    assert autotune._apply_pins(Plan("gemm", 64, 4, cluster=True)) == Plan("wgmma_rs", 64, 4)
    monkeypatch.setenv("CUDA_EXL3_PATH", "wgmma")  # the TMA wgmma GEMM reduces through the accumulator only
    assert autotune._apply_pins(Plan("wgmma_rs", 64, 4, cluster=True)).cluster is False
    monkeypatch.setenv("CUDA_EXL3_PATH", "wgmma_rs")
    monkeypatch.setenv("CUDA_EXL3_SPLIT", "6")
    monkeypatch.setenv("CUDA_EXL3_DETERMINISTIC", "1")
    monkeypatch.setattr(_ops, "wgmma_rs_has_cluster", lambda: True)
    assert autotune._apply_pins(Plan("gemm", 64, 1), cluster_splitk=True) == Plan("wgmma_rs", 64, 6, cluster=True)
    assert autotune._apply_pins(Plan("gemm", 64, 1), cluster_splitk=False) == Plan("wgmma_rs", 64, 1)
    monkeypatch.setattr(_ops, "wgmma_rs_has_cluster", lambda: False)
    assert autotune._apply_pins(Plan("gemm", 64, 1), cluster_splitk=True) == Plan("wgmma_rs", 64, 1)
    for v in ("PATH", "SPLIT", "DETERMINISTIC", "AUTOTUNE", "CLUSTER"):
        monkeypatch.delenv(f"CUDA_EXL3_{v}", raising=False)
    monkeypatch.setattr(autotune.torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(autotune, "sm_count", lambda device: 132)
    shape, dev = LayerShape(4096, (11008,), (8,), 1), torch.device("cpu")
    for has, knob in ((False, "1"), (True, "1"), (True, "0")):
        monkeypatch.setattr(_ops, "wgmma_rs_has_cluster", lambda: has)
        monkeypatch.setenv("CUDA_EXL3_WGMMA_RS_CLUSTER", knob)
        timed: list[Plan] = []
        monkeypatch.setattr(autotune, "_time", lambda fn, device, reps=5, graph=False: fn() or 0.1)
        autotune.clear()
        autotune.choose(shape, 64, torch.float16, dev, ACC, (16, 32, 64, 128), timed.append, cluster_splitk=True,
                        wgmma_rs=True)
        assert any(p.path == "wgmma_rs" for p in timed)
        assert any(p.path == "wgmma_rs" and p.cluster for p in timed) == (has and knob == "1")
    autotune.clear()


def test_autotune_key_changes_with_the_timing_mode(monkeypatch):
    """Plans timed eagerly and as graph replays are cached apart: toggling CUDA_EXL3_AUTOTUNE_GRAPH in a running process
    re-tunes instead of serving the other mode's plan (review, fourteenth session)."""
    from exl3_kernels import autotune
    from exl3_kernels.plan import LayerShape

    shape, dev = LayerShape(4096, (4096,), (8,), 1), torch.device("cpu")
    monkeypatch.delenv("CUDA_EXL3_AUTOTUNE_GRAPH", raising=False)
    off = autotune._key(shape, 8, torch.float16, dev, False)
    monkeypatch.setenv("CUDA_EXL3_AUTOTUNE_GRAPH", "0")
    assert autotune._key(shape, 8, torch.float16, dev, False) == off
    monkeypatch.setenv("CUDA_EXL3_AUTOTUNE_GRAPH", "1")
    assert autotune._key(shape, 8, torch.float16, dev, False) != off


def test_wgmma_stream_k_candidate(monkeypatch):
    """The stream-k wgmma plan: one more candidate for m >= WGMMA_MIN_M when the caller offers it (wgmma_sk), never in
    deterministic mode (nothing is timed there); shown as wgmma(sk); a pinned split or another pinned path drops it;
    offered by the layer unless CUDA_EXL3_WGMMA_SK=0 or the library's op lacks the argument."""
    from exl3_kernels import _ops, autotune, linear
    from exl3_kernels.plan import WGMMA_MIN_M, sk_acc_elems

    sk = Plan("wgmma", 256, 1, stream_k=True)
    assert str(sk) == "wgmma(sk)" and sk != Plan("wgmma", 256, 1)
    for shape in SHAPES:
        for m in (64, 127, 128, 256, 1000, 4096):
            with_w = candidates(shape, m, 132, ACC, wgmma=True)
            with_sk = candidates(shape, m, 132, ACC, wgmma=True, wgmma_sk=True)
            extra = [p for p in with_sk if p not in with_w]
            assert [p for p in with_sk if p not in extra] == with_w
            assert extra == ([sk] if m >= WGMMA_MIN_M else []), (shape, m)
            assert sk not in candidates(shape, m, 132, ACC, deterministic=True, wgmma=True, wgmma_sk=True)
            assert sk not in candidates(shape, m, 132, ACC, wgmma=False, wgmma_sk=True)
    # one slot of 32768 running sums and one flag per block, whatever the shape; its own workspace, so offered whatever
    # the accumulator's size
    assert sk_acc_elems(132) == 1024 + 132 * 32768
    assert sk in candidates(SHAPES[0], 256, 132, 1, wgmma=True, wgmma_sk=True)
    for v in ("PATH", "BM", "SPLIT", "LOHI", "DETERMINISTIC"):
        monkeypatch.delenv(f"CUDA_EXL3_{v}", raising=False)
    assert autotune._apply_pins(sk) == sk
    monkeypatch.setenv("CUDA_EXL3_PATH", "wgmma")
    assert autotune._apply_pins(sk) == sk
    monkeypatch.setenv("CUDA_EXL3_SPLIT", "2")
    assert autotune._apply_pins(sk) == Plan("wgmma", 256, 2)
    monkeypatch.delenv("CUDA_EXL3_SPLIT")
    for path in ("gemm", "wgmma_rs", "reconstruct"):
        monkeypatch.setenv("CUDA_EXL3_PATH", path)
        assert not autotune._apply_pins(sk).stream_k, path
    monkeypatch.delenv("CUDA_EXL3_PATH")
    monkeypatch.setattr(_ops, "wgmma_has_stream_k", lambda: True)
    monkeypatch.delenv("CUDA_EXL3_WGMMA_SK", raising=False)
    assert linear.wgmma_sk_offered()
    monkeypatch.setenv("CUDA_EXL3_WGMMA_SK", "0")
    assert not linear.wgmma_sk_offered()
    monkeypatch.setattr(_ops, "wgmma_has_stream_k", lambda: False)
    monkeypatch.setenv("CUDA_EXL3_WGMMA_SK", "1")
    assert not linear.wgmma_sk_offered()


def test_kernel_count_with_the_split_k_finish_in_the_gemm(monkeypatch):
    """With tile counters (CUDA_EXL3_SPLITK_FINISH unset = on, a library that takes them, m <= 16) the split-k epilogue
    kernel goes: the mma.sync GEMM's split-k plans through the accumulator and every register-A plan are one kernel fewer; the
    cluster, wgmma and dense plans are unchanged; a library without counters keeps the old counts."""
    from exl3_kernels import _ops
    from exl3_kernels.autotune import kernel_count

    monkeypatch.delenv("CUDA_EXL3_SPLITK_FINISH", raising=False)
    monkeypatch.setattr(_ops, "has_tile_flags", lambda: True)
    assert kernel_count(Plan("gemm", 16, 16)) == 2 and kernel_count(Plan("gemm", 16, 1)) == 2
    assert kernel_count(Plan("gemm", 16, 8, fused_it=True)) == 1
    assert kernel_count(Plan("gemm", 16, 8, cluster=True)) == 2
    assert kernel_count(Plan("wgmma_rs", 8, 1)) == 2 and kernel_count(Plan("wgmma_rs", 64, 3)) == 2
    assert kernel_count(Plan("wgmma", 256, 3)) == 3
    assert [kernel_count(Plan(p)) for p in ("reconstruct", "reconstruct_n", "reconstruct_act")] == [2, 3, 4]
    # only up to m = SPLITK_FINISH_MAX_M (16): from the bucket 32 on the epilogue kernel runs again
    assert kernel_count(Plan("gemm", 16, 16), m=4) == 2 and kernel_count(Plan("wgmma_rs", 8, 1), m=4) == 2
    assert kernel_count(Plan("gemm", 16, 16), m=16) == 2 and kernel_count(Plan("wgmma_rs", 16, 4), m=9) == 2
    assert kernel_count(Plan("gemm", 16, 16), m=17) == 3 and kernel_count(Plan("gemm", 32, 8), m=32) == 3
    assert kernel_count(Plan("wgmma_rs", 64, 3), m=64) == 3
    assert kernel_count(Plan("gemm", 16, 8, fused_it=True), m=16) == 1  # fused_it plans exist only at m <= 16
    monkeypatch.setenv("CUDA_EXL3_SPLITK_FINISH", "0")
    assert kernel_count(Plan("gemm", 16, 8, fused_it=True), m=16) == 2 and kernel_count(Plan("wgmma_rs", 8, 1), m=1) == 3
    monkeypatch.delenv("CUDA_EXL3_SPLITK_FINISH")
    monkeypatch.setattr(_ops, "has_tile_flags", lambda: False)
    assert kernel_count(Plan("gemm", 16, 16)) == 3 and kernel_count(Plan("wgmma_rs", 8, 1)) == 3


def test_splitk_finish_rule_is_whole_m_buckets():
    """The autotuner keys plans by m bucket (powers of two), so the finish-in-GEMM rule must not cut a bucket: every m of
    a bucket on one side of plan.SPLITK_FINISH_MAX_M. It also stays within the fused input-transform range (a fused_it
    plan's kernel count assumes the counters at every m it is offered)."""
    from exl3_kernels.plan import FUSED_IT_MAX_M, SPLITK_FINISH_MAX_M, m_bucket

    assert m_bucket(SPLITK_FINISH_MAX_M) == SPLITK_FINISH_MAX_M
    for m in range(1, 4 * SPLITK_FINISH_MAX_M + 1):
        assert (m <= SPLITK_FINISH_MAX_M) == (m_bucket(m) <= SPLITK_FINISH_MAX_M), m
    assert SPLITK_FINISH_MAX_M >= FUSED_IT_MAX_M
