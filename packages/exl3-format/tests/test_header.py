"""Header-only safetensors reading: valid files, every rejection, shard indexes, oracle files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from exl3_format_testutil import MUL1_I32, ORACLE_DIR, TINY_LLAMA, marker, write_raw
from safetensors.numpy import save_file

from exl3_format import Exl3FormatError, TensorInfo, list_checkpoint_tensors, read_header, read_marker_u32
from exl3_format import header as header_mod


def _save(path: Path, tensors: dict) -> Path:
    save_file(tensors, str(path))
    return path


def test_read_header_matches_safetensors(tmp_path):
    path = _save(
        tmp_path / "a.safetensors",
        {
            "w.trellis": np.zeros((4, 8, 40), np.int16),
            "w.suh": np.ones(64, np.float16),
            "b": np.ones(3, np.float32),
            "w.mul1": marker(MUL1_I32),
        },
    )
    raw = path.read_bytes()
    header_len = int.from_bytes(raw[:8], "little")
    doc = json.loads(raw[8 : 8 + header_len])
    infos = read_header(path)
    assert set(infos) == {"w.trellis", "w.suh", "b", "w.mul1"}
    t = infos["w.trellis"]
    assert t == TensorInfo(
        "w.trellis",
        "I16",
        (4, 8, 40),
        str(path),
        8 + header_len + doc["w.trellis"]["data_offsets"][0],
        8 + header_len + doc["w.trellis"]["data_offsets"][1],
    )
    assert t.nbytes == 4 * 8 * 40 * 2 and t.numel == 1280
    assert infos["w.mul1"].shape == () and infos["w.mul1"].nbytes == 4 and infos["w.mul1"].numel == 1
    assert infos["b"].dtype == "F32" and infos["w.suh"].dtype == "F16"
    # data_end of the last tensor is the end of the file
    assert max(info.data_end for info in infos.values()) == len(raw)
    assert read_marker_u32(infos["w.mul1"]) == 0x83DCD12D


def test_metadata_entry_is_accepted_and_dropped(tmp_path):
    path = tmp_path / "m.safetensors"
    save_file({"x": np.zeros(2, np.int16)}, str(path), metadata={"format": "pt"})
    assert list(read_header(path)) == ["x"]


def _entry(dtype="I16", shape=(2,), offsets=(0, 4)):
    return {"dtype": dtype, "shape": list(shape), "data_offsets": list(offsets)}


@pytest.mark.parametrize(
    ("header", "data", "length", "what"),
    [
        (b"", b"", None, "8-byte header length"),  # replaced below by a 3-byte file
        ({"x": _entry()}, b"\0" * 4, 10_000, "header length runs past the end"),
        (b"{not json", b"", None, "invalid header JSON"),
        (b"\xff\xfe{}", b"", None, "invalid header JSON"),
        (b"[1, 2]", b"", None, "not a JSON object"),
        (b'{"x": 1, "x": 2}', b"", None, "invalid header JSON"),
        ({"x": 5}, b"", None, "header entry"),
        ({"x": {"dtype": "I16", "shape": [2]}}, b"", None, "lacks 'data_offsets'"),
        ({"x": {"shape": [2], "data_offsets": [0, 4]}}, b"\0" * 4, None, "lacks 'dtype'"),
        ({"x": _entry(dtype="Q4_K")}, b"\0" * 4, None, "unknown dtype"),
        ({"x": _entry(dtype=7)}, b"\0" * 4, None, "unknown dtype"),
        ({"x": _entry(shape=(-2,))}, b"\0" * 4, None, "bad shape"),
        ({"x": {"dtype": "I16", "shape": [True], "data_offsets": [0, 2]}}, b"\0" * 2, None, "bad shape"),
        ({"x": _entry(offsets=(0,))}, b"\0" * 4, None, "bad data_offsets"),
        ({"x": _entry(offsets=(4, 0))}, b"\0" * 4, None, "bad data_offsets"),
        ({"x": _entry(offsets=(0, 6))}, b"\0" * 6, None, "disagree with dtype and shape"),
        ({"x": _entry(offsets=(0, 4))}, b"\0" * 2, None, "runs past the end of the file"),
        ({"x": _entry(), "y": _entry(offsets=(2, 6))}, b"\0" * 6, None, "overlaps"),
        ({"x": _entry(dtype="F4", shape=(3,), offsets=(0, 2))}, b"\0" * 2, None, "whole bytes"),
        ({"__metadata__": {"a": 1}}, b"", None, "bad __metadata__"),
        (b'{"x": {"dtype": "I16", "shape": [NaN], "data_offsets": [0, 2]}}', b"\0\0", None, "invalid header JSON"),
    ],
)
def test_read_header_rejects(tmp_path, header, data, length, what):
    path = tmp_path / "bad.safetensors"
    if header == b"":
        path.write_bytes(b"\x01\x02\x03")
    else:
        write_raw(path, header, data, length)
    with pytest.raises(Exl3FormatError, match=what) as info:
        read_header(path)
    assert info.value.file == str(path)
    assert str(path) in str(info.value)


def test_error_names_tensor_expected_and_found(tmp_path):
    path = write_raw(tmp_path / "x.safetensors", {"w.trellis": _entry(offsets=(0, 6))}, b"\0" * 6)
    with pytest.raises(Exl3FormatError) as info:
        read_header(path)
    err = info.value
    assert err.tensor == "w.trellis"
    assert err.expected == "4 bytes (I16 [2])" and err.found == "6 bytes"
    assert "'w.trellis'" in str(err) and "expected 4 bytes (I16 [2])" in str(err) and "found 6 bytes" in str(err)


def test_truncated_real_file(tmp_path):
    path = _save(tmp_path / "t.safetensors", {"a": np.zeros((16, 16), np.float16)})
    raw = path.read_bytes()
    for cut in (0, 5, 8, 20, len(raw) - 1):
        path.write_bytes(raw[:cut])
        with pytest.raises(Exl3FormatError):
            read_header(path)


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(Exl3FormatError, match="cannot read file"):
        read_header(tmp_path / "nope.safetensors")
    with pytest.raises(Exl3FormatError, match="cannot read file"):
        read_header(tmp_path)


def test_header_size_cap(tmp_path, monkeypatch):
    monkeypatch.setattr(header_mod, "MAX_HEADER_BYTES", 16)
    path = write_raw(tmp_path / "big.safetensors", {"x": _entry()}, b"\0" * 4)
    with pytest.raises(Exl3FormatError, match="header too large"):
        read_header(path)


def test_read_marker_rejects_non_marker(tmp_path):
    path = _save(tmp_path / "m.safetensors", {"x.mul1": np.zeros(1, np.int32), "y.mcg": np.array(1.0, np.float32)})
    infos = read_header(path)
    with pytest.raises(Exl3FormatError, match=r"expected I32 \[\] \(0-dim\), found I32 \[1\]"):
        read_marker_u32(infos["x.mul1"])
    with pytest.raises(Exl3FormatError, match="found F32"):
        read_marker_u32(infos["y.mcg"])


def test_read_marker_truncated_after_header(tmp_path):
    path = _save(tmp_path / "m.safetensors", {"x.mul1": marker(MUL1_I32)})
    info = read_header(path)["x.mul1"]
    path.write_bytes(path.read_bytes()[:-2])
    with pytest.raises(Exl3FormatError, match="marker data truncated"):
        read_marker_u32(info)


class _CountingFile:
    def __init__(self, handle, log):
        self._handle, self._log = handle, log

    def read(self, size=-1):
        data = self._handle.read(size)
        self._log.append(len(data))
        return data

    def __getattr__(self, name):
        return getattr(self._handle, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._handle.close()


def test_header_reader_reads_only_the_header(tmp_path, monkeypatch):
    path = _save(tmp_path / "big.safetensors", {"w.trellis": np.zeros((64, 64, 128), np.int16)})
    log: list[int] = []
    real_open = header_mod._open
    monkeypatch.setattr(header_mod, "_open", lambda p: _CountingFile(real_open(p), log))
    read_header(path)
    header_len = int.from_bytes(path.read_bytes()[:8], "little")
    assert sum(log) == 8 + header_len
    assert path.stat().st_size > 1_000_000


# --- checkpoints: single file, *.safetensors set, shard index ------------------------------------------------


def test_list_single_file_and_dir(tmp_path):
    _save(tmp_path / "model.safetensors", {"a": np.zeros(2, np.int16)})
    _save(tmp_path / "other.safetensors", {"b": np.zeros(2, np.int16)})  # ignored: model.safetensors wins
    assert list(list_checkpoint_tensors(tmp_path)) == ["a"]
    assert list(list_checkpoint_tensors(tmp_path / "model.safetensors")) == ["a"]


def test_list_safetensors_set(tmp_path):
    _save(tmp_path / "part-b.safetensors", {"b": np.zeros(2, np.int16)})
    _save(tmp_path / "part-a.safetensors", {"a": np.zeros(2, np.int16)})
    tensors = list_checkpoint_tensors(tmp_path)
    assert list(tensors) == ["a", "b"]
    assert tensors["b"].file.endswith("part-b.safetensors")


def test_list_rejects_duplicate_across_files(tmp_path):
    _save(tmp_path / "part-a.safetensors", {"a": np.zeros(2, np.int16)})
    _save(tmp_path / "part-b.safetensors", {"a": np.zeros(2, np.int16)})
    with pytest.raises(Exl3FormatError, match="tensor stored in two files") as info:
        list_checkpoint_tensors(tmp_path)
    assert info.value.tensor == "a"


def test_list_no_weights(tmp_path):
    with pytest.raises(Exl3FormatError, match="no weights"):
        list_checkpoint_tensors(tmp_path)
    with pytest.raises(Exl3FormatError, match="checkpoint path"):
        list_checkpoint_tensors(tmp_path / "absent")


def _index(tmp_path, weight_map):
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def test_list_index(tmp_path):
    _save(tmp_path / "model-00001-of-00002.safetensors", {"a": np.zeros(2, np.int16), "c": np.zeros(1, np.int16)})
    _save(tmp_path / "model-00002-of-00002.safetensors", {"b": np.zeros(2, np.int16)})
    _save(tmp_path / "consolidated.safetensors", {"a": np.zeros(2, np.int16)})  # not in the index: ignored
    _index(tmp_path, {"b": "model-00002-of-00002.safetensors", "a": "model-00001-of-00002.safetensors"})
    tensors = list_checkpoint_tensors(tmp_path)
    # files in order of first mention; "c" is in a shard but not in the index: included (headers win)
    assert list(tensors) == ["b", "a", "c"]
    assert list_checkpoint_tensors(tmp_path / "model.safetensors.index.json").keys() == tensors.keys()


def test_index_missing_shard(tmp_path):
    _save(tmp_path / "model-00001-of-00002.safetensors", {"a": np.zeros(2, np.int16)})
    _index(tmp_path, {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"})
    with pytest.raises(Exl3FormatError, match="missing shard file") as info:
        list_checkpoint_tensors(tmp_path)
    assert info.value.file.endswith("model-00002-of-00002.safetensors") and info.value.tensor == "b"


def test_index_tensor_absent_from_shard(tmp_path):
    _save(tmp_path / "model-00001-of-00001.safetensors", {"a": np.zeros(2, np.int16)})
    _index(tmp_path, {"a": "model-00001-of-00001.safetensors", "zz": "model-00001-of-00001.safetensors"})
    with pytest.raises(Exl3FormatError, match="absent from its shard") as info:
        list_checkpoint_tensors(tmp_path)
    assert info.value.tensor == "zz"


@pytest.mark.parametrize(
    "index",
    [b"{", b"[]", b'{"weight_map": []}', b'{"weight_map": {"a": 3}}', b'{"weight_map": {"a": "../x.safetensors"}}'],
)
def test_index_invalid(tmp_path, index):
    (tmp_path / "model.safetensors.index.json").write_bytes(index)
    with pytest.raises(Exl3FormatError) as info:
        list_checkpoint_tensors(tmp_path)
    assert info.value.file.endswith("model.safetensors.index.json")


# --- real files -----------------------------------------------------------------------------------------------


@pytest.mark.skipif(not ORACLE_DIR.is_dir(), reason="oracle files not present")
def test_oracle_files_parse():
    files = sorted(ORACLE_DIR.glob("*.safetensors"))
    assert len(files) >= 7
    by_file = {f.name: read_header(f) for f in files}
    for name, infos in by_file.items():
        assert infos, name
        assert max(i.data_end for i in infos.values()) == (ORACLE_DIR / name).stat().st_size
    lut = by_file["codebook_lut.safetensors"]
    assert {n: (i.dtype, i.shape) for n, i in lut.items()} == {
        f"lut.{cb}": ("F32", (65536,)) for cb in ("3inst", "mcg", "mul1")
    }
    rec = by_file["reconstruct_vectors.safetensors"]
    # trellis int16 [16, 24, 16K] for k=256, n=384 (oracle README), half rates with mul1
    assert rec["mul1.K2.5.trellis"].dtype == "I16" and rec["mul1.K2.5.trellis"].shape == (16, 24, 40)
    assert rec["3inst.K8.trellis"].shape == (16, 24, 128)
    assert rec["mcg.K3.w_hat"].shape == (256, 384) and rec["mcg.K3.w_hat"].dtype == "F16"
    gemm = by_file["gemm_vectors_mul1.safetensors"]
    assert gemm["mul1.K2.5.trellis"].shape == (32, 48, 40)  # k=512, n=768, K=2.5
    assert (gemm["mul1.K2.5.suh"].dtype, gemm["mul1.K2.5.suh"].shape) == ("F16", (512,))
    assert (gemm["mul1.K2.5.svh"].dtype, gemm["mul1.K2.5.svh"].shape) == ("F16", (768,))
    assert by_file["unpack_vectors.safetensors"]["K3.trellis"].shape == (2, 2, 48)


@pytest.mark.skipif(not TINY_LLAMA.is_dir(), reason="tiny model not present")
def test_tiny_llama_header():
    tensors = list_checkpoint_tensors(TINY_LLAMA)
    assert tensors["model.embed_tokens.weight"].shape == (8192, 256)
    assert tensors["model.embed_tokens.weight"].dtype == "F32"  # config.json: "dtype": "float32"
    assert tensors["model.layers.0.mlp.down_proj.weight"].shape == (256, 768)
    assert sum(i.nbytes for i in tensors.values()) + 8 < (TINY_LLAMA / "model.safetensors").stat().st_size
