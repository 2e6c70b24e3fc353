"""The smem-operand wgmma GEMM's code generation, checked on its SASS without a GPU (tools/wgmma_sass_report.py).

Both role layouts of csrc/gemm_sm90/wgmma_gemm.cu must keep the wgmma pipeline: no HGMMA serialized (ptxas info
C7518), no wait-all after a stage's group on the way to the next stage, and no spill in the mcg K = 4 kernels. The
default build (one producer warpgroup, the fall-through layout) and the EXL3_WGMMA_PWG=2 build (two producer
warpgroups, if/else arms, the consumer warpgroup index taken from the shuffled warpgroup index) are both compiled. A
mutant of the second with the consumer index computed from threadIdx.x shows the check failing: that form is what
serialized the prototype's P = 2 wgmmas (docs/hopper-gemm.md, "Decoding consumers, and P = 2 after all").
Skips without nvcc or cuobjdump (CI has both).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "packages" / "exl3-kernels"
SRC = PKG / "csrc" / "gemm_sm90" / "wgmma_gemm.cu"
sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_wgmma_rs_sass import CUOBJDUMP, NVCC, needs_tools  # noqa: E402

sys.path.insert(0, str(ROOT / "tools"))
import wgmma_sass_report as wsr  # noqa: E402


def _funcs(src: Path, tmp_path: Path, defines: tuple[str, ...] = ()) -> dict[str, dict[str, int]]:
    cubin = tmp_path / (src.stem + ".cubin")
    subprocess.run([NVCC, "-cubin", str(src), "-o", str(cubin), "-O3", "-std=c++17", "--expt-relaxed-constexpr",
                    *defines, f"-DEXL3_K2_MASK={1 << 8:#x}u", "-DEXL3_WGMMA_CB_MASK=0x2",
                    "-gencode=arch=compute_90a,code=sm_90a", f"-I{PKG / 'csrc' / 'include'}", f"-I{PKG / 'csrc'}"],
                   check=True, capture_output=True)
    env = dict(os.environ)
    env["PATH"] = str(Path(CUOBJDUMP).parent) + os.pathsep + env.get("PATH", "")
    sass = subprocess.run([CUOBJDUMP, "-sass", str(cubin)], check=True, capture_output=True, text=True, env=env).stdout
    return {name: wsr.report(ins) for name, ins in wsr.split_functions(sass).items()}


@needs_tools
@pytest.mark.parametrize("pwg", (1, 2))
def test_both_role_layouts_keep_the_wgmma_pipeline(tmp_path, pwg):
    funcs = _funcs(SRC, tmp_path, (f"-DEXL3_WGMMA_PWG={pwg}",))
    names = sorted(n for n in funcs if "wgmma_gemm" in n)
    assert len(names) == 2, names  # the tiled kernel and the stream-k kernel, mcg
    for n in names:
        r = funcs[n]
        assert r["hgmma"] == 12, (n, r)  # one m64 half (4) and two halves (8) per stage
        assert r["serialized"] == 0 and r["wait_all"] == 0 and r["spills"] == 0, (n, r)


@needs_tools
def test_a_thread_index_consumer_warpgroup_serializes_at_two_producer_warpgroups(tmp_path):
    text = SRC.read_text()
    old = "const int cw = kPWG == 1 ? ct >> 7 : wgi - kPWG;"
    assert text.count(old) == 2
    mutant = tmp_path / "wgmma_gemm_mutant.cu"
    mutant.write_text(text.replace(old, "const int cw = ct >> 7;"))
    funcs = _funcs(mutant, tmp_path, ("-DEXL3_WGMMA_PWG=2",))
    assert any(r["serialized"] > 0 for n, r in funcs.items() if "wgmma_gemm" in n), funcs
