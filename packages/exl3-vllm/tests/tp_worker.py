"""One rank of the TP=2 test (run as ``python tp_worker.py RANK WORLD PORT OUT GOOD_CKPT BAD_CKPT``).

On gloo, with vLLM's CPU platform, rank ``RANK`` of ``WORLD``:
1. builds the model of ``GOOD_CKPT`` at TP=WORLD through vLLM's load path and runs every EXL3 module on the same
   full-width input as every other rank (row-parallel modules get their input slice; column outputs are
   all-gathered), then the whole model (attention replaced by torch SDPA over the rank's heads);
2. tries to build ``BAD_CKPT`` at TP=WORLD, which must be refused during construction.
Rank 0 writes ``OUT/rank0.pt`` with the inputs, gathered outputs, logits and the refusal message.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from exl3_vllm_testutil import force_cpu_platform  # noqa: E402

force_cpu_platform()

import torch  # noqa: E402
from exl3_vllm_testutil import (  # noqa: E402
    build_model,
    engine_config,
    exl3_modules,
    init_distributed,
    logits_of,
    use_torch_attention,
)

PROMPT = [1, 5, 17, 300, 999, 42, 7, 8, 64, 3]


def main() -> None:
    rank, world, port = (int(a) for a in sys.argv[1:4])
    out, good, bad = Path(sys.argv[4]), sys.argv[5], sys.argv[6]
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    init_distributed(world, rank, port)
    from vllm.distributed import tensor_model_parallel_all_gather

    from exl3_vllm.errors import Exl3VllmError
    from exl3_vllm.loader import Exl3WeightLoader

    cfg = engine_config(good, "float32", tp=world)
    model = build_model(cfg)
    use_torch_attention(model)
    result: dict = {"modules": {}}
    gen = torch.Generator().manual_seed(0)
    for name, module in exl3_modules(model).items():
        layout = module.quant_method.layout
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
            "layout": layout.describe(),
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
    if rank == 0:
        torch.save(result, out / "rank0.pt")


if __name__ == "__main__":
    main()
