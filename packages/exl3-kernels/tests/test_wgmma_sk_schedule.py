"""The stream-k schedule of the wgmma GEMM (csrc/gemm_sm90/wgmma_gemm.cu, "stream-k"), restated in Python from the
kernel (SkSegment and the descending segment walk) and checked for every block count up to past the unit count of
several layer shapes: every (tile, stage) unit is computed by exactly one block; a tile's blocks are consecutive, from
its first block (found here by search over the block starts) to its finalizer (the block with the tile's last stage),
so the running sum of a tile passes from block b - 1 to block b (the kernel's s_lo > 0 test); every contributor leaves
one partial (so one slot per block suffices) as its block's first work; every wait goes to block b - 1, a lower block
(the deadlock-freedom argument of the kernel's header)."""
from __future__ import annotations

import bisect

import pytest


def _schedule(U: int, T: int, G: int):
    """Per block, its segments in the order the kernel computes them: (t, s_lo, ns, fin, j)."""
    out = []
    for b in range(G):
        u0, u1 = b * U // G, (b + 1) * U // G
        segs, hi = [], u1
        while hi > u0:
            t = (hi - 1) // T
            lo = max(u0, t * T)
            s_lo, ns = lo - t * T, hi - lo
            j = 0 if s_lo == 0 else b - ((t * T + 1) * G - 1) // U
            segs.append((t, s_lo, ns, s_lo + ns == T, j))
            hi -= ns
        out.append(segs)
    return out


@pytest.mark.parametrize("tiles,T", [(3, 16), (6, 16), (32, 64), (86, 64), (96, 80), (40, 272), (2, 8), (1, 1)])
def test_sk_schedule_covers_each_unit_once_and_orders_the_handover(tiles, T):
    U = tiles * T
    for G in sorted({1, 2, 3, 5, 7, 13, 64, 132, 264, U}):
        if G > U:  # ops.cpp clamps the block count to the units
            continue
        sched = _schedule(U, T, G)
        starts = [bb * U // G for bb in range(G)]
        seen = [0] * U
        contrib: dict[int, list[tuple[int, int]]] = {}
        final: dict[int, tuple[int, int]] = {}
        for b, segs in enumerate(sched):
            assert segs, (G, b)  # U >= G: every block owns at least one unit
            for i, (t, s_lo, ns, fin, j) in enumerate(segs):
                assert ns >= 1 and 0 <= s_lo and s_lo + ns <= T
                for s in range(s_lo, s_lo + ns):
                    seen[t * T + s] += 1
                # the tile's first block by search over the block starts, against the kernel's closed form
                first = bisect.bisect_right(starts, t * T) - 1
                assert j == b - first, (G, b, t)
                if fin:
                    final[t] = (b, j)
                else:
                    assert i == 0, (G, b, t)  # a partial others wait for is the block's first work
                    contrib.setdefault(t, []).append((b, j))
        assert seen == [1] * U, G
        assert sorted(final) == list(range(tiles))
        for t, (b, j) in final.items():
            cs = contrib.get(t, [])
            assert [jj for _, jj in cs] == list(range(len(cs))), (G, t)  # block order
            assert j == len(cs), (G, t)
            assert all(bb < b for bb, _ in cs), (G, t)  # waits go to lower blocks only
