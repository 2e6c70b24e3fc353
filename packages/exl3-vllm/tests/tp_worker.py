"""The ranks of the CPU tensor-parallel test (run as ``python tp_worker.py OUT GOOD_CKPT BAD_CKPT WORLD...``).

This process imports vLLM once and then, for each ``WORLD`` in turn, forks that many ranks (vLLM's own multiproc
executor forks its workers the same way); importing vLLM costs ~15 s of CPU per process here, which six ranks on a
two-core machine would otherwise pay six times. On gloo, with vLLM's CPU platform, rank ``r`` of ``WORLD``:

1. builds the model of ``GOOD_CKPT`` at TP=WORLD through vLLM's load path and runs every EXL3 module on the same
   full-width input as every other rank (row-parallel modules get their input slice; column outputs are
   all-gathered), then the whole model (attention replaced by torch SDPA over the rank's heads);
2. tries to build ``BAD_CKPT`` at TP=WORLD, which must be refused during construction, before any weight loads.

Every rank writes ``OUT/tp<WORLD>/rank<r>.pt`` with its layouts and the refusal; rank 0 adds the inputs, gathered
outputs and logits. Each rank's stdout/stderr go to ``OUT/tp<WORLD>/rank<r>.log``. The launcher exits 1, printing
the logs, when a rank fails or outlives ``DEADLINE_S`` (the other ranks are then killed, since they would wait
forever in a collective).

torch.compile is off in the ranks: at TP > 1 vLLM compiles ``VocabParallelEmbedding``'s masking function
(``get_masked_input_and_mask``), ~18 s of inductor per rank on two cores; eager mode runs the same torch code.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from exl3_vllm_testutil import force_cpu_platform  # noqa: E402

force_cpu_platform()

import torch  # noqa: E402
from exl3_vllm_testutil import (  # noqa: E402
    build_model,
    engine_config,
    exl3_modules,
    free_port,
    init_distributed,
    logits_of,
    use_torch_attention,
)

PROMPT = [1, 5, 17, 300, 999, 42, 7, 8, 64, 3]
DEADLINE_S = 240


def run_rank(rank: int, world: int, port: int, out: Path, good: str, bad: str) -> None:
    """One rank's work (see the module docstring)."""
    import torch._dynamo as dynamo

    dynamo.config.disable = True
    torch.set_num_threads(1)  # WORLD ranks share the machine's cores
    init_distributed(world, rank, port)
    from vllm.distributed import tensor_model_parallel_all_gather

    from exl3_vllm.errors import Exl3VllmError
    from exl3_vllm.loader import Exl3WeightLoader

    cfg = engine_config(good, "float32", tp=world)
    model = build_model(cfg)
    use_torch_attention(model)
    result: dict = {"modules": {}, "layouts": {}}
    gen = torch.Generator().manual_seed(0)
    for name, module in exl3_modules(model).items():
        layout = module.quant_method.layout
        result["layouts"][name] = layout.describe()
        if layout.kind == "row":
            x = torch.randn(5, layout.k_in * world, generator=gen)
            local = x[:, rank * layout.k_in : (rank + 1) * layout.k_in]
            y, _ = module(local)
        else:
            x = torch.randn(5, layout.k_in, generator=gen)
            y = module.quant_method.apply(module, x) if name == "lm_head" else module(x)[0]
            y = tensor_model_parallel_all_gather(y.contiguous())
        result["modules"][name] = {
            "kind": layout.kind,
            "x": x,
            "y": y,
            "widths": [s.width for s in layout.shards],
        }
    result["logits"] = logits_of(model, cfg, PROMPT)

    calls = []
    real_call = Exl3WeightLoader.__call__

    def counting(self, *args, **kwargs):
        calls.append(self.layout.module)
        return real_call(self, *args, **kwargs)

    Exl3WeightLoader.__call__ = counting
    try:
        build_model(engine_config(bad, "float32", tp=world))
        result["refusal"] = None
    except Exl3VllmError as err:
        result["refusal"] = str(err)
    result["loads_before_refusal"] = len(calls)
    from vllm.distributed import destroy_distributed_environment, destroy_model_parallel

    destroy_model_parallel()
    destroy_distributed_environment()
    if rank != 0:
        result = {"layouts": result["layouts"], "refusal": result["refusal"],
                  "loads_before_refusal": result["loads_before_refusal"]}
    torch.save(result, out / f"rank{rank}.pt")


def _rank_main(rank: int, world: int, port: int, out: Path, good: str, bad: str) -> None:
    log = open(out / f"rank{rank}.log", "w")  # noqa: SIM115 - held until os._exit
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    code = 0
    try:
        run_rank(rank, world, port, out, good, bad)
    except BaseException:  # noqa: BLE001 - reported in the rank's log, the launcher prints it
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _import_before_fork() -> None:
    """Import what every rank uses, so that the forked ranks share it instead of each importing it again."""
    import torch._dynamo  # noqa: F401
    import vllm.distributed  # noqa: F401
    import vllm.engine.arg_utils  # noqa: F401
    import vllm.model_executor.model_loader  # noqa: F401
    import vllm.model_executor.models.llama  # noqa: F401
    import vllm.model_executor.models.qwen2  # noqa: F401

    import exl3_vllm.config  # noqa: F401
    import exl3_vllm.linear  # noqa: F401


def run_world(world: int, out: Path, good: str, bad: str) -> bool:
    """Fork the ``world`` ranks, wait for them; True when all exited 0 (else their logs are printed)."""
    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    ctx = multiprocessing.get_context("fork")
    ranks = [ctx.Process(target=_rank_main, args=(r, world, port, out, good, bad)) for r in range(world)]
    for p in ranks:
        p.start()
    deadline = time.monotonic() + DEADLINE_S
    while any(p.is_alive() for p in ranks):
        if any(p.exitcode not in (None, 0) for p in ranks) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    for p in ranks:
        if p.is_alive():
            p.kill()
        p.join()
    failed = [r for r, p in enumerate(ranks) if p.exitcode != 0]
    for r in failed:
        log = (out / f"rank{r}.log").read_text()
        print(f"--- TP={world} rank {r}: exit code {ranks[r].exitcode} ---\n{log[-4000:]}")
    return not failed


def main() -> int:
    out, good, bad = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    worlds = [int(a) for a in sys.argv[4:]]
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    _import_before_fork()
    ok = [run_world(world, out / f"tp{world}", good, bad) for world in worlds]
    return 0 if all(ok) else 1


if __name__ == "__main__":
    sys.exit(main())
