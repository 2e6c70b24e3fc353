"""exl3-inspect on the synthetic Qwen3-MoE-like checkpoint (mixed K, MTP module, sharded, hint mismatch)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from exl3_format.cli import main


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def data_bytes(path: Path) -> int:
    """Tensor bytes of every shard, computed from file sizes and the 8-byte header length alone."""
    total = 0
    for f in sorted(path.glob("*.safetensors")):
        raw = f.read_bytes()
        total += len(raw) - 8 - int.from_bytes(raw[:8], "little")
    return total


def test_json_report(capsys, qwen3_moe):
    code, out, err = run(capsys, str(qwen3_moe), "--json")
    assert code == 0 and err == ""
    report = json.loads(out)
    assert report["architecture"] == "Qwen3MoeForCausalLM" and report["model_type"] == "qwen3_moe"
    assert report["quantization_config"] == {
        "quant_method": "exl3",
        "version": "1.6.5",
        "bits": 3.18,
        "head_bits": 6,
        "codebook": "mul1",
    }
    modules = {row["key"]: row for row in report["modules"]}
    assert len(modules) == 50
    assert list(modules)[:5] == [
        "lm_head",
        "model.layers.0.mlp.experts.0.down_proj",
        "model.layers.0.mlp.experts.0.gate_proj",
        "model.layers.0.mlp.experts.0.up_proj",
        "model.layers.0.mlp.experts.1.down_proj",
    ]
    q = modules["model.layers.0.self_attn.q_proj"]
    assert q == {
        "key": "model.layers.0.self_attn.q_proj",
        "role": "decoder",
        "k": 512,
        "n": 512,
        "k_unpadded": 512,
        "n_unpadded": 512,
        "K": 4,
        "codebook": "mul1",
        "bias": False,
        "legacy_signs": False,
        "bytes": 32 * 32 * 64 * 2 + 2 * 512 * 2 + 4,
    }
    assert (modules["model.layers.1.self_attn.k_proj"]["K"], modules["model.layers.1.self_attn.v_proj"]["K"]) == (5, 5)
    assert modules["model.layers.1.self_attn.k_proj"]["bytes"] == 32 * 8 * 80 * 2 + 512 * 2 + 128 * 2 + 4
    head = modules["lm_head"]
    assert (head["role"], head["k"], head["n"], head["n_unpadded"], head["K"]) == ("head", 512, 1024, 1000, 6)
    expert = modules["model.layers.1.mlp.experts.3.down_proj"]
    assert (expert["K"], expert["k"], expert["n"], expert["bytes"]) == (
        2.5,
        256,
        512,
        16 * 32 * 40 * 2 + 256 * 2 + 512 * 2 + 4,
    )
    assert modules["mtp.fc"]["role"] == "mtp" and modules["mtp.fc"]["k_unpadded"] == 1024
    assert modules["mtp.layers.0.mlp.experts.2.up_proj"]["role"] == "mtp"

    totals = report["totals"]
    assert totals["linears"] == 50 and totals["decoder_linears"] == 32
    assert totals["decoder_bits"] == round(14155776 / 4456448, 4) == 3.1765
    assert totals["config_bits"] == 3.18
    assert totals["total_bytes"] == data_bytes(qwen3_moe)
    assert totals["linear_bytes"] == sum(row["bytes"] for row in report["modules"])
    assert totals["other_tensors"] == 13 and totals["other_bytes"] == totals["total_bytes"] - totals["linear_bytes"]
    assert totals["decoder_storage_bpw"] == pytest.approx(
        8 * sum(r["bytes"] for r in report["modules"] if r["role"] == "decoder") / 4456448, abs=1e-4
    )
    assert [(h["K"], h["modules"], h["weights"]) for h in report["k_histogram"]] == [
        (2.5, 12, 1572864),
        (3, 24, 3145728),
        (4, 9, 2228224),
        (5, 4, 262144),
        (6, 1, 524288),
    ]
    assert sum(h["share"] for h in report["k_histogram"]) == pytest.approx(1.0)

    assert {tp: entry["admitted"] for tp, entry in report["tp"].items()} == {
        "1": True,
        "2": True,
        "4": False,
        "8": False,
    }
    assert len(report["tp"]["4"]["reasons"]) == 6 and len(report["tp"]["8"]["reasons"]) == 11
    assert all("experts" in reason for reason in report["tp"]["4"]["reasons"])
    assert len(report["expert_groups"]) == 9
    assert {(g["layer_prefix"], g["projection"]): g["K"] for g in report["expert_groups"]}[
        ("model.layers.1.mlp.experts", "up_proj")
    ] == [2.5]
    assert report["warnings"] == [
        "quantization_config.json: model.layers.0.self_attn.k_proj: bits_per_weight: hint says 4, headers say 5"
    ]
    assert report["resolution"] is None


def test_text_report(capsys, qwen3_moe):
    code, out, _ = run(capsys, str(qwen3_moe))
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == f"EXL3 checkpoint: {qwen3_moe}"
    assert lines[1] == (
        "architecture: Qwen3MoeForCausalLM (qwen3_moe); quantization_config: quant_method exl3, version 1.6.5, "
        "bits 3.18, head_bits 6, codebook mul1"
    )

    def row(key: str) -> list[str]:
        (line,) = [line for line in lines if line.startswith(key + " ")]
        return line.split()

    assert row("model.layers.0.self_attn.k_proj")[1:] == ["512", "x", "128", "512", "x", "128", "5", "mul1", "42244"]
    assert row("lm_head")[1:] == ["512", "x", "1024", "512", "x", "1000", "6", "mul1", "396292"]
    assert row("model.layers.1.mlp.experts.0.gate_proj")[7:9] == ["2.5", "mul1"]
    assert row("mtp.fc")[1:8] == ["1024", "x", "512", "1024", "x", "512", "4"]
    assert "experts: model.layers.1.mlp.experts.*.down_proj: 4 experts, K 2.5, mul1" in lines
    assert any(line.startswith("totals: 50 EXL3 linears ") for line in lines)
    assert "decoder layers: 32 linears, average K 3.18 bpw (storage 3.27 bpw incl. suh/svh); config bits 3.18" in lines
    hist = [line.split() for line in lines if line.startswith("  K=")]
    assert [h[:3] for h in hist] == [
        ["K=2.5", "12", "modules"],
        ["K=3", "24", "modules"],
        ["K=4", "9", "modules"],
        ["K=5", "4", "modules"],
        ["K=6", "1", "modules"],
    ]
    assert "  TP=1: admitted" in lines and "  TP=2: admitted" in lines
    assert "  TP=4: rejected" in lines and "  TP=8: rejected" in lines
    assert any(line.startswith("    - mtp.fc: column split of n=512 at TP=8") for line in lines)
    assert lines[-2] == "warnings (1):"
    assert (
        lines[-1]
        == "  - quantization_config.json: model.layers.0.self_attn.k_proj: bits_per_weight: hint says 4, headers say 5"
    )


def test_tp_option(capsys, qwen3_moe):
    code, out, _ = run(capsys, str(qwen3_moe), "--tp", "2", "--json")
    assert code == 0
    report = json.loads(out)
    assert list(report["tp"]) == ["2"] and report["tp"]["2"]["admitted"]
    tp = {row["key"]: row["tp"] for row in report["modules"]}
    assert tp["model.layers.0.self_attn.q_proj"]["per_rank"] == [256, 256]
    assert tp["model.layers.0.self_attn.k_proj"]["mode"] == "replicated"  # 2 KV heads of 64
    assert tp["model.layers.0.self_attn.o_proj"]["split_dim"] == "k"
    assert tp["model.layers.0.mlp.experts.0.down_proj"] == {
        "mode": "row",
        "reason": None,
        "split_dim": "k",
        "per_rank": [128, 128],
        "padded": 256,
        "replicas": 1,
        "note": "",
    }
    assert tp["lm_head"]["per_rank"] == [512, 512]

    code, out, _ = run(capsys, str(qwen3_moe), "--tp", "2")
    assert code == 0
    (line,) = [line for line in out.splitlines() if line.startswith("model.layers.0.self_attn.q_proj ")]
    assert line.endswith("column n 256/256")

    code, out, _ = run(capsys, str(qwen3_moe), "--tp", "4", "--json")
    assert code == 3
    report = json.loads(out)
    assert report["tp"]["4"]["admitted"] is False
    row = {r["key"]: r["tp"] for r in report["modules"]}["model.layers.0.mlp.experts.0.up_proj"]
    assert row["reason"].startswith("column split of n=256 at TP=4 puts a rank boundary at 64")

    code, out, _ = run(capsys, str(qwen3_moe), "--tp", "4", "--moe", "expert")
    assert code == 0 and "  TP=4: admitted" in out.splitlines()


def test_engine_names(capsys, qwen3_moe, tmp_path):
    names = tmp_path / "names.txt"
    names.write_text(
        "# vLLM module names\n"
        "model.layers.0.self_attn.qkv_proj\nmodel.layers.0.self_attn.o_proj\nmodel.layers.0.mlp.experts\n"
        "language_model.model.layers.1.self_attn.o_proj\nlm_head\nmodel.layers.0.mlp.shared_expert.up_proj\n"
    )
    code, out, _ = run(capsys, str(qwen3_moe), "--json", "--engine-names", str(names))
    assert code == 0
    res = json.loads(out)["resolution"]
    assert res["counts"] == {"exact": 3, "wrapper-dropped": 1, "reordered": 0, "fused": 1, "unresolved": 1}
    assert res["fused"] == {
        "model.layers.0.self_attn.qkv_proj": [f"model.layers.0.self_attn.{p}" for p in ("q_proj", "k_proj", "v_proj")]
    }
    assert res["mapping"] == {"language_model.model.layers.1.self_attn.o_proj": "model.layers.1.self_attn.o_proj"}
    assert res["unresolved_engine"] == ["model.layers.0.mlp.shared_expert.up_proj"]
    assert len(res["unclaimed_checkpoint"]) == 50 - 3 - 1 - 12 - 1 - 1
    warnings = json.loads(out)["warnings"]
    assert "1 engine module name(s) not found in the checkpoint: model.layers.0.mlp.shared_expert.up_proj" in warnings
    assert any(w.startswith("32 checkpoint module(s) not claimed by any engine module: ") for w in warnings)

    names_json = tmp_path / "names.json"
    names_json.write_text(json.dumps(["lm_head"]))
    code, out, _ = run(capsys, str(qwen3_moe), "--engine-names", str(names_json))
    assert code == 0 and "engine names: exact 1" in out


def test_errors_exit_1(capsys, tmp_path, qwen3_moe):
    code, out, err = run(capsys, str(tmp_path / "absent"))
    assert code == 1 and out == "" and "exl3-inspect: error:" in err and "absent" in err
    bad = tmp_path / "names.json"
    bad.write_text("{}")
    code, out, err = run(capsys, str(qwen3_moe), "--engine-names", str(bad))
    assert code == 1 and out == "" and "expected JSON list of strings" in err
    shard = sorted(qwen3_moe.glob("*.safetensors"))[1]
    shard.write_bytes(shard.read_bytes()[:1000])
    code, out, err = run(capsys, str(qwen3_moe), "--json")
    assert code == 1 and out == "" and str(shard) in err
    with pytest.raises(SystemExit) as info:
        main([str(qwen3_moe), "--tp", "0"])
    assert info.value.code == 2


def test_runs_without_torch(qwen3_moe):
    """The CLI must work where torch cannot be imported (and must not import it where it can)."""
    script = textwrap.dedent(
        f"""
        import importlib.abc, json, sys
        class NoTorch(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name == "torch" or name.startswith("torch."):
                    raise ImportError("torch is blocked in this test")
        sys.meta_path.insert(0, NoTorch())
        from exl3_format.cli import main
        code = main([{str(qwen3_moe)!r}, "--json"])
        assert code == 0, code
        assert not any(m == "torch" or m.startswith("torch.") for m in sys.modules)
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["totals"]["linears"] == 50


def test_summary_line(qwen3_moe):
    """The one-line start-up summary the vLLM plugin logs: counts, bytes, bits and the K histogram agree with the
    full report."""
    from exl3_format import load_checkpoint, summary_line
    from exl3_format.report import build_report

    checkpoint = load_checkpoint(qwen3_moe)
    line = summary_line(checkpoint)
    assert line == ("exl3: 50 quantized linears, 3.27 MiB (checkpoint 4.26 MiB); decoder 3.176 bits/weight "
                    "(3.267 stored), codebook mul1; K=2.5 x12, K=3 x24, K=4 x9, K=5 x4, K=6 x1")
    report = build_report(checkpoint)
    assert report["totals"]["linears"] == 50 and round(report["totals"]["decoder_bits"], 3) == 3.176
    assert [(slot["K"], slot["modules"]) for slot in report["k_histogram"]] == [(2.5, 12), (3, 24), (4, 9), (5, 4), (6, 1)]
