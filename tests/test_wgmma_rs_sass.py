"""The register-A wgmma GEMM's A-register invariant, checked on its SASS without a GPU (tools/check_wgmma_rs_sass.py).

ptxas gives HGMMA no read scoreboard: an instruction that writes an A register of a wgmma group before the
WARPGROUP.DEPBAR that retires the group corrupts the product (every BM >= 64 check of the prototype failed on the H200
that way, docs/hopper-gemm.md, "Register-A wgmma"). The kernel keeps the registers with a read in the same asm statement
as the wait (wgmma_rs_gemm.cu, wgmma_wait_keep); this test compiles a reduced instance set to a cubin (nvcc, sm_90a)
and scans its SASS (cuobjdump and nvdisasm from the dev dependencies nvidia-cuda-cuobjdump / -nvdisasm), and shows the scan failing on a mutant
with the keep-alive replaced by a plain wait. Skips without nvcc or cuobjdump (CI has both).
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "packages" / "exl3-kernels"
SRC = PKG / "csrc" / "gemm_sm90" / "wgmma_rs_gemm.cu"


def _tool(name: str, extra_dirs: list[Path]) -> str | None:
    for d in extra_dirs:
        if (d / name).is_file():
            return str(d / name)
    return shutil.which(name)


def _cuda_home_bin() -> list[Path]:
    dirs = [Path(os.environ["CUDA_HOME"]) / "bin"] if os.environ.get("CUDA_HOME") else []
    return dirs + [Path("/usr/local/cuda/bin")]


def _pip_cuda_bin() -> list[Path]:
    spec = importlib.util.find_spec("nvidia")
    if spec is None or not spec.submodule_search_locations:
        return []
    return [Path(p) / "cu13" / "bin" for p in spec.submodule_search_locations]


NVCC = _tool("nvcc", _cuda_home_bin())
CUOBJDUMP = _tool("cuobjdump", _pip_cuda_bin() + _cuda_home_bin())
needs_tools = pytest.mark.skipif(NVCC is None or CUOBJDUMP is None, reason="needs nvcc and cuobjdump")

sys.path.insert(0, str(ROOT / "tools"))
from check_wgmma_rs_sass import check  # noqa: E402


def _sass(src: Path, tmp_path: Path, k2_mask: int, defines: tuple[str, ...] = ()) -> str:
    cubin = tmp_path / (src.stem + ".cubin")
    subprocess.run([NVCC, "-cubin", str(src), "-o", str(cubin), "-O3", "-std=c++17", "--expt-relaxed-constexpr",
                    *defines, f"-DEXL3_K2_MASK={k2_mask:#x}u", "-DEXL3_WGMMA_CB_MASK=0x2",
                    "-gencode=arch=compute_90a,code=sm_90a", f"-I{PKG / 'csrc' / 'include'}", f"-I{PKG / 'csrc'}"],
                   check=True, capture_output=True)
    env = dict(os.environ)  # cuobjdump -sass runs nvdisasm: take the one beside it (nvidia-cuda-nvdisasm)
    env["PATH"] = str(Path(CUOBJDUMP).parent) + os.pathsep + env.get("PATH", "")
    return subprocess.run([CUOBJDUMP, "-sass", str(cubin)], check=True, capture_output=True, text=True, env=env).stdout


@needs_tools
def test_no_write_to_the_a_registers_of_an_inflight_wgmma(tmp_path):
    """mcg at K = 2, 4, 5, 7 (K2 4, 8, 10, 14; K2 14 is an instance ptxas spills in at BM 16 / 32), every BM tier:
    20 kernels."""
    sass = _sass(SRC, tmp_path, (1 << 4) | (1 << 8) | (1 << 10) | (1 << 14))
    assert sass.count("Function : _ZN4exl32rs15wgmma_rs_kernel") == 20
    assert sass.count("HGMMA") >= 20 * 8
    problems = check(sass)
    assert problems == [], problems[:10]


@needs_tools
@pytest.mark.parametrize("x_mask,t_mask", [(0x1F, 0x1F), (0x0, 0x0)])
def test_every_copy_mode_keeps_the_a_registers(tmp_path, x_mask, t_mask):
    """The copy mode is chosen per BM tier at compile time (EXL3_RS_TMA_X_MASK / _T_MASK, wgmma_rs_gemm.cu; the
    defaults mix both): every tier with every load by the bulk-copy unit, and every tier below BM 128 with cp.async
    only, keeps the same invariant (mcg K = 4, 5 kernels each)."""
    sass = _sass(SRC, tmp_path, 1 << 8, (f"-DEXL3_RS_TMA_X_MASK={x_mask:#x}", f"-DEXL3_RS_TMA_T_MASK={t_mask:#x}"))
    assert sass.count("Function : _ZN4exl32rs15wgmma_rs_kernel") == 5
    assert "UBLKCP" in sass and "UTMALDG" in sass  # BM 128 always uses the bulk-copy unit
    assert ("LDGSTS" in sass) == (x_mask != 0x1F)  # cp.async only where a tier below BM 128 keeps it
    problems = check(sass)
    assert problems == [], problems[:10]


@needs_tools
def test_the_check_fails_without_the_keep_alive(tmp_path):
    """The same kernel with wgmma_wait_keep replaced by a plain wgmma.wait_group: ptxas then reuses in-flight A
    registers (thousands of hits at K = 4), so the scan above can fail."""
    text = SRC.read_text()
    assert text.count("wgmma_wait_keep<") >= 4
    mutant = tmp_path / "wgmma_rs_gemm_mutant.cu"
    body = text
    for n in ("0", "1"):
        for a in ("a[P]", "a[0]", "a[1]"):
            body = body.replace(f"wgmma_wait_keep<{n}>(keep, {a});", f"wgmma_wait<{n}>();")
    assert "wgmma_wait_keep<" not in body  # every call site replaced
    mutant.write_text(body)
    sass = _sass(mutant, tmp_path, 1 << 8)
    assert len(check(sass)) > 100


def test_generated_wgmma_header_is_current():
    """exl3/wgmma_rs.cuh is what tools/gen_wgmma_rs.py writes (no hand edits, no stale copy)."""
    from gen_wgmma_rs import OUT, render

    text = (ROOT / OUT).read_text()
    assert text == render()
    assert text.count("\"wgmma.mma_async.sync.aligned.m64n") == 6  # one asm string per N
