"""Probe (written in the thirty-second session, run in the thirty-third: no, see docs/kernels.md, "The reconstruct path
in pipelined column chunks does not pay"): does the reconstruct path gain from building W's column chunk j + 1 on a
second stream while cuBLAS multiplies chunk j?

Today the path is two kernels in series: reconstruct (W = the layer's dense bf16 weight, both Hadamards folded in,
written to a workspace) then cuBLAS. At m = 256 on 4096x4096 that is ~14.5 + ~15 us against cuBLAS's ~15 alone; at
m = 2048 the reconstruct's ~12 us is what keeps 4096x4096 / qkv at the 1.15x edge (docs/kernels.md). If the two
kernels can run concurrently (cuBLAS's blocks take a whole SM each, so they can only share the GPU by SMs, not inside
one), chunking hides part of the reconstruct. This times, per shape and m, in CUDA-graph replay with the weights
rotated past the L2 (bench/timing.py):

    op        exl3_linear with CUDA_EXL3_PATH=reconstruct (the op as it is: one reconstruct, one GEMM)
    serial    C column chunks, reconstruct chunk j then cuBLAS on chunk j, one stream
    pipe      the same chunks, reconstruct of chunk j + 1 on a side stream (two workspaces, events) while the main
              stream multiplies chunk j
    cublas    x @ W with a dense bf16 W (the ratio's denominator)

and checks that pipe's y equals serial's (the same kernels on the same chunks: bit for bit) and is close to op's.

    python bench/recon_pipe_probe.py --out probe.json [--shapes 4096x4096,4096x11008] [--ms 256,512,2048] [--chunks 2,4,8]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_gemm import SHAPES, make_layer  # noqa: E402
from timing import copies_for, graph_time_us  # noqa: E402

from exl3_kernels import _ops, autotune  # noqa: E402
from exl3_kernels.linear import CODEBOOK_IDS, exl3_linear  # noqa: E402


def chunk_bounds(n: int, chunks: int) -> list[tuple[int, int]]:
    """[c0, c1) column ranges of ``chunks`` near-equal chunks of n, each a multiple of 128 (the reconstruct's tile)."""
    tiles = n // 128
    edges = [round(i * tiles / chunks) * 128 for i in range(chunks + 1)]
    return [(a, b) for a, b in zip(edges[:-1], edges[1:]) if b > a]


class Pipe:
    """The chunked reconstruct + cuBLAS of one single-shard layer, serial or pipelined over two streams."""

    def __init__(self, k: int, n: int, chunks: int, device: torch.device):
        self.bounds = chunk_bounds(n, chunks)
        self.k = k
        width = max(b - a for a, b in self.bounds)
        self.flat = [torch.empty(k * width, device=device, dtype=torch.bfloat16) for _ in range(2)]  # two workspaces
        self.side = torch.cuda.Stream(device)
        self.ready = [torch.cuda.Event() for _ in self.bounds]  # W of chunk j written
        self.freed = [torch.cuda.Event() for _ in self.bounds]  # cuBLAS done with the buffer of chunk j

    def _w(self, j: int) -> torch.Tensor:
        """Chunk j's W, [k, width of chunk j], contiguous, in workspace j % 2."""
        a, b = self.bounds[j]
        return self.flat[j % 2][: self.k * (b - a)].view(self.k, b - a)

    def _build(self, layer, j: int) -> None:
        a, b = self.bounds[j]
        _ops.reconstruct_out(self._w(j), layer.trellis, layer.suh, layer.svh, CODEBOOK_IDS[layer.codebook], a, b, True)

    def serial(self, x: torch.Tensor, layer) -> torch.Tensor:
        y = torch.empty(x.shape[0], self.bounds[-1][1], device=x.device, dtype=x.dtype)
        for j, (a, b) in enumerate(self.bounds):
            self._build(layer, j)
            torch.mm(x, self._w(j), out=y[:, a:b])
        return y

    def pipe(self, x: torch.Tensor, layer) -> torch.Tensor:
        main = torch.cuda.current_stream()
        y = torch.empty(x.shape[0], self.bounds[-1][1], device=x.device, dtype=x.dtype)
        self.side.wait_stream(main)  # the side stream starts after everything before this call
        for j in range(len(self.bounds)):
            with torch.cuda.stream(self.side):
                if j >= 2:
                    self.side.wait_event(self.freed[j - 2])  # buffer j % 2 was chunk j - 2's, read by its cuBLAS
                self._build(layer, j)
                self.ready[j].record(self.side)
            a, b = self.bounds[j]
            main.wait_event(self.ready[j])
            torch.mm(x, self._w(j), out=y[:, a:b])
            self.freed[j].record(main)
        main.wait_stream(self.side)  # join: the side stream's work is part of this call
        return y


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default="4096x4096,4096x11008,17408x5120")
    ap.add_argument("--ms", default="256,512,2048")
    ap.add_argument("--chunks", default="2,4,8")
    ap.add_argument("--K", type=float, default=4.0)
    args = ap.parse_args(argv)
    dev = torch.device("cuda")
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "K": args.K, "points": []}
    for name in args.shapes.split(","):
        k, ns, _ = SHAPES[name]
        if len(ns) != 1:
            raise SystemExit(f"recon_pipe_probe: single-shard shapes only, got {name}")
        n = ns[0]
        layers = [make_layer(k, [n], [args.K], "mcg", s) for s in range(copies_for(int(k * n * args.K / 8)))]
        dense = [torch.randn(k, n, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(copies_for(2 * k * n))]
        for m in (int(v) for v in args.ms.split(",")):
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            p = {"shape": name, "m": m}
            old = os.environ.get("CUDA_EXL3_PATH")
            os.environ["CUDA_EXL3_PATH"] = "reconstruct"
            autotune.clear()
            try:
                p["op_us"] = graph_time_us([lambda L=L: exl3_linear(x, L) for L in layers])
                y_op = exl3_linear(x, layers[0])
            finally:
                if old is None:
                    os.environ.pop("CUDA_EXL3_PATH", None)
                else:
                    os.environ["CUDA_EXL3_PATH"] = old
            p["cublas_us"] = graph_time_us([lambda W=W: x @ W for W in dense])
            for c in (int(v) for v in args.chunks.split(",")):
                pp = Pipe(k, n, c, dev)
                p[f"serial{c}_us"] = graph_time_us([lambda L=L: pp.serial(x, L) for L in layers])
                p[f"pipe{c}_us"] = graph_time_us([lambda L=L: pp.pipe(x, L) for L in layers])
                ys, yp = pp.serial(x, layers[0]), pp.pipe(x, layers[0])
                torch.cuda.synchronize()
                p[f"pipe{c}_equal_serial"] = bool(torch.equal(ys, yp))
                p[f"pipe{c}_rel_err_op"] = ((yp.float() - y_op.float()).norm() / y_op.float().norm()).item()
            print(json.dumps(p), flush=True)
            res["points"].append(p)
            Path(args.out).write_text(json.dumps(res, indent=1))
        del layers, dense
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
