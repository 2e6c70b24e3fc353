"""Hypothesis fuzzing: whatever bytes a file holds, only Exl3FormatError may escape the readers."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from exl3_format_testutil import MUL1_I32, CheckpointBuilder, marker
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.numpy import save_file

from exl3_format import DTYPE_BITS, Exl3FormatError, build_report, load_checkpoint, read_header, render_text

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz")


@pytest.fixture(scope="module")
def valid_bytes(workdir) -> bytes:
    path = workdir / "valid.safetensors"
    save_file(
        {
            "m.trellis": np.zeros((2, 2, 40), np.int16),
            "m.suh": np.ones(32, np.float16),
            "m.svh": np.ones(32, np.float16),
            "m.mul1": marker(MUL1_I32),
            "x": np.zeros(3, np.float32),
        },
        str(path),
    )
    return path.read_bytes()


def _read(path, data: bytes):
    path.write_bytes(data)
    try:
        infos = read_header(path)
    except Exl3FormatError:
        return None
    size = len(data)
    for info in infos.values():  # whatever is accepted is consistent
        assert 8 <= info.data_start <= info.data_end <= size
        assert info.dtype in DTYPE_BITS
        assert info.nbytes * 8 == info.numel * DTYPE_BITS[info.dtype]
    return infos


@FUZZ
@given(data=st.binary(max_size=512))
def test_random_bytes(workdir, data):
    _read(workdir / "random.safetensors", data)


@FUZZ
@given(body=st.binary(max_size=256), length=st.integers(min_value=0, max_value=2**64 - 1))
def test_random_length_prefix(workdir, body, length):
    _read(workdir / "prefix.safetensors", struct.pack("<Q", length) + body)


@FUZZ
@given(data=st.data())
def test_mutated_valid_file(workdir, valid_bytes, data):
    raw = bytearray(valid_bytes)
    header_end = 8 + int.from_bytes(raw[:8], "little")
    for _ in range(data.draw(st.integers(1, 4))):
        op = data.draw(st.sampled_from(["flip", "set", "truncate", "insert", "delete"]))
        if not raw:
            break
        pos = data.draw(st.integers(0, min(len(raw), header_end + 8) - 1))
        if op == "flip":
            raw[pos] ^= 1 << data.draw(st.integers(0, 7))
        elif op == "set":
            raw[pos] = data.draw(st.integers(0, 255))
        elif op == "truncate":
            del raw[pos:]
        elif op == "insert":
            raw[pos:pos] = data.draw(st.binary(min_size=1, max_size=8))
        else:
            del raw[pos : pos + data.draw(st.integers(1, 8))]
    _read(workdir / "mutated.safetensors", bytes(raw))


_json_leaf = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False), st.text(max_size=8)
)
_json = st.recursive(
    _json_leaf,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)
_entry = st.fixed_dictionaries(
    {
        "dtype": st.sampled_from([*sorted(DTYPE_BITS), "Q8", "", "i16"]),
        "shape": st.lists(st.integers(-1, 40), max_size=4),
        "data_offsets": st.lists(st.integers(-4, 600), min_size=0, max_size=3),
    }
)


@FUZZ
@given(
    header=st.dictionaries(st.text(max_size=12), st.one_of(_entry, _json), max_size=5),
    data_len=st.integers(0, 600),
)
def test_structured_headers(workdir, header, data_len):
    raw = json.dumps(header).encode()
    _read(workdir / "structured.safetensors", struct.pack("<Q", len(raw)) + raw + b"\0" * data_len)


_part_shape = st.lists(st.integers(0, 6), min_size=0, max_size=4).map(tuple)
_np_dtype = st.sampled_from([np.int16, np.float16, np.float32, np.int32])


@FUZZ
@given(
    parts=st.dictionaries(
        st.sampled_from(["trellis", "suh", "svh", "su", "sv", "bias", "mcg", "mul1", "scale", "weight", "signs"]),
        st.tuples(_part_shape, _np_dtype),
        max_size=6,
    ),
    last=st.sampled_from([16, 24, 32, 40, 48, 56, 64, 17, 0]),
    config=_json
    | st.dictionaries(
        st.sampled_from(
            [
                "architectures",
                "model_type",
                "hidden_size",
                "num_attention_heads",
                "num_key_value_heads",
                "head_dim",
                "intermediate_size",
                "num_hidden_layers",
                "quantization_config",
                "text_config",
                "tie_word_embeddings",
            ]
        ),
        _json,
    ),
    hint=st.none() | _json | st.fixed_dictionaries({"bits": _json, "tensor_storage": _json}),
)
def test_load_checkpoint_random_modules(workdir, parts, last, config, hint):
    """Random tensor sets for one module plus random config.json / quantization_config.json: load (and report) or
    raise Exl3FormatError, nothing else."""
    root = workdir / "ckpt"
    for old in root.glob("*"):
        old.unlink()
    builder = CheckpointBuilder(root)
    for suffix, (shape, dtype) in parts.items():
        if suffix == "trellis" and len(shape) == 3:
            shape = shape[:2] + (last,)
        builder.tensor(f"model.layers.0.mlp.up_proj.{suffix}", np.zeros(shape, dtype))
    builder.tensor("model.norm.weight", np.zeros(4, np.float16))
    builder.write()
    (root / "config.json").write_text(json.dumps(config))
    if hint is not None:
        (root / "quantization_config.json").write_text(json.dumps(hint))
    try:
        checkpoint = load_checkpoint(root)
        for tp in (None, 2):
            render_text(build_report(checkpoint, tp=tp, engine_names=["model.layers.0.mlp.up_proj", "x"]))
    except Exl3FormatError:
        return
    for linear in checkpoint.linears.values():  # anything accepted obeys the shape rules
        t = linear.trellis
        assert t.dtype == "I16" and t.shape == (linear.k // 16, linear.n // 16, int(16 * linear.K))
        assert linear.tensors.get("suh") is None or linear.tensors["suh"].shape == (linear.k,)
        assert linear.tensors.get("svh") is None or linear.tensors["svh"].shape == (linear.n,)
        assert linear.k > 0 and linear.n > 0
