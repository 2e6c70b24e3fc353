"""Header-only safetensors reader.

A safetensors file is ``u64 little-endian header length N`` + ``N bytes of UTF-8 JSON`` + the data buffer; each
JSON entry is ``{"dtype": str, "shape": [int, ...], "data_offsets": [begin, end]}`` with offsets relative to the
start of the data buffer, plus an optional ``"__metadata__": {str: str}`` entry (format: safetensors
``README.md`` / ``safetensors/src/tensor.rs``). This module reads the length and the JSON header of each file and
never the tensor data, except :func:`read_marker_u32`, which reads the 4 bytes of a 0-dim ``I32`` codebook marker.

Checkpoint layouts (exllamav3 1.6.5 ``conversion/compile.py``, see ``docs/exl3-format.md`` §1.1): a single
``model.safetensors``, or ``model-0000N-of-0000M.safetensors`` shards listed by ``model.safetensors.index.json``
(``{"metadata": {...}, "weight_map": {tensor: file}}``). exllamav3 writes no ``__metadata__`` format marker.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import BinaryIO

from .errors import Exl3FormatError

__all__ = [
    "DTYPE_BITS",
    "INDEX_FILE",
    "MAX_HEADER_BYTES",
    "TensorInfo",
    "list_checkpoint_tensors",
    "read_header",
    "read_marker_u32",
]

#: Bits per element of every dtype tag safetensors defines (safetensors 0.6+ ``Dtype`` enum, ``tensor.rs``).
#: The sub-byte float types are packed; a tensor of them must still fill whole bytes.
DTYPE_BITS: dict[str, int] = {
    "BOOL": 8,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "F64": 64,
    "I64": 64,
    "U64": 64,
    "C64": 64,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
}

#: Largest header accepted, in bytes; the same cap the safetensors library applies (``MAX_HEADER_SIZE``).
MAX_HEADER_BYTES = 100_000_000

#: Name of the shard index file written next to sharded checkpoints.
INDEX_FILE = "model.safetensors.index.json"

_SINGLE_FILE = "model.safetensors"


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as described by a safetensors header.

    Attributes:
        name: full tensor name, e.g. ``"model.layers.0.self_attn.q_proj.trellis"``.
        dtype: safetensors dtype tag (``"I16"``, ``"F16"``, ``"BF16"``, ``"F32"``, ``"I32"``, ...).
        shape: dims in elements; ``()`` for a 0-dim tensor.
        file: path of the file holding the data.
        data_start: absolute byte offset of the first data byte in ``file`` (8 + header length + begin).
        data_end: absolute byte offset one past the last data byte.
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    file: str
    data_start: int
    data_end: int

    @property
    def nbytes(self) -> int:
        """Size of the tensor data in bytes."""
        return self.data_end - self.data_start

    @property
    def numel(self) -> int:
        """Number of elements (1 for a 0-dim tensor)."""
        count = 1
        for dim in self.shape:
            count *= dim
        return count

    def describe(self) -> str:
        """``"I16 [16, 32, 64]"``: dtype and shape, as used in error messages."""
        return f"{self.dtype} {list(self.shape)}"


def _open(path: str) -> BinaryIO:
    """Open a file for binary reading (a seam for tests that count the bytes read)."""
    return open(path, "rb")


def _reject_duplicates(pairs: list[tuple[str, object]]) -> dict:
    result: dict = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"duplicate key {key!r}")
        result[key] = value
    return result


def _reject_constant(name: str) -> object:
    raise ValueError(f"non-standard JSON constant {name}")


def _parse_json(raw: bytes, file: str, what: str) -> object:
    """Decode UTF-8 JSON strictly (no duplicate keys, no NaN/Infinity); any failure is an Exl3FormatError."""
    try:
        text = raw.decode("utf-8")
        return json.loads(text, object_pairs_hook=_reject_duplicates, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise Exl3FormatError(what, file=file, expected="valid UTF-8 JSON", found=str(exc)[:200]) from None


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def read_header(path: str | os.PathLike) -> dict[str, TensorInfo]:
    """Read and validate the header of one safetensors file, without reading tensor data.

    Args:
        path: the ``.safetensors`` file.

    Returns:
        ``{tensor name: TensorInfo}`` in header order (``__metadata__`` is validated and dropped).

    Raises:
        Exl3FormatError: the file cannot be opened; it is shorter than the 8-byte length prefix; the header
            length exceeds the file size - 8 (truncated file) or :data:`MAX_HEADER_BYTES`; the header is not a
            UTF-8 JSON object (or has duplicate keys); an entry lacks ``dtype``/``shape``/``data_offsets`` or has
            wrong types; the dtype is unknown (:data:`DTYPE_BITS`); ``data_offsets`` disagree with
            dtype size x numel, run past the end of the file, or overlap another tensor.
    """
    file = os.fspath(path)
    try:
        with _open(file) as handle:
            size = os.fstat(handle.fileno()).st_size
            prefix = handle.read(8)
            if len(prefix) < 8:
                raise Exl3FormatError(
                    "file too short for the 8-byte header length",
                    file=file,
                    expected=">= 8 bytes",
                    found=f"{size} bytes",
                )
            header_len = int.from_bytes(prefix, "little")
            if header_len > size - 8:
                raise Exl3FormatError(
                    "header length runs past the end of the file (truncated?)",
                    file=file,
                    expected=f"<= {size - 8} bytes (file size - 8)",
                    found=f"{header_len} bytes",
                )
            if header_len > MAX_HEADER_BYTES:
                raise Exl3FormatError(
                    "header too large", file=file, expected=f"<= {MAX_HEADER_BYTES} bytes", found=header_len
                )
            raw = handle.read(header_len)
    except OSError as exc:
        raise Exl3FormatError("cannot read file", file=file, expected="a readable file", found=str(exc)) from None
    if len(raw) != header_len:
        raise Exl3FormatError("short read of the header", file=file, expected=header_len, found=len(raw))

    header = _parse_json(raw, file, "invalid header JSON")
    if not isinstance(header, dict):
        raise Exl3FormatError("header is not a JSON object", file=file, expected="object", found=type(header).__name__)

    data_base = 8 + header_len
    tensors: dict[str, TensorInfo] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            if not isinstance(entry, dict) or not all(isinstance(v, str) for v in entry.values()):
                raise Exl3FormatError(
                    "bad __metadata__", file=file, expected="object of strings", found=repr(entry)[:100]
                )
            continue
        tensors[name] = _parse_entry(name, entry, file, data_base, size)

    # Tensor data must not overlap (safetensors itself requires a contiguous, hole-free buffer; exllamav3 does
    # not rely on that, so only overlaps are rejected).
    spans = sorted((info.data_start, info.data_end, info.name) for info in tensors.values() if info.nbytes)
    for (_, end_a, name_a), (start_b, _, name_b) in pairwise(spans):
        if start_b < end_a:
            raise Exl3FormatError(
                f"tensor data overlaps {name_a!r}",
                file=file,
                tensor=name_b,
                expected=f"data_start >= {end_a}",
                found=start_b,
            )
    return tensors


def _parse_entry(name: str, entry: object, file: str, data_base: int, size: int) -> TensorInfo:
    if not isinstance(entry, dict):
        raise Exl3FormatError("header entry", file=file, tensor=name, expected="object", found=type(entry).__name__)
    for field in ("dtype", "shape", "data_offsets"):
        if field not in entry:
            raise Exl3FormatError(f"header entry lacks {field!r}", file=file, tensor=name)
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
        raise Exl3FormatError(
            "unknown dtype", file=file, tensor=name, expected="one of " + ", ".join(DTYPE_BITS), found=repr(dtype)
        )
    if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
        raise Exl3FormatError(
            "bad shape", file=file, tensor=name, expected="list of non-negative ints", found=repr(shape)[:100]
        )
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_int(o) for o in offsets)):
        raise Exl3FormatError(
            "bad data_offsets", file=file, tensor=name, expected="[begin, end] ints", found=repr(offsets)[:100]
        )
    begin, end = offsets
    if not 0 <= begin <= end:
        raise Exl3FormatError("bad data_offsets", file=file, tensor=name, expected="0 <= begin <= end", found=offsets)
    numel = 1
    for dim in shape:
        numel *= dim
    bits = numel * DTYPE_BITS[dtype]
    if bits % 8:
        raise Exl3FormatError(
            "tensor does not fill whole bytes", file=file, tensor=name, expected="numel x bits % 8 == 0", found=bits
        )
    if end - begin != bits // 8:
        raise Exl3FormatError(
            "data_offsets disagree with dtype and shape",
            file=file,
            tensor=name,
            expected=f"{bits // 8} bytes ({dtype} {shape})",
            found=f"{end - begin} bytes",
        )
    if data_base + end > size:
        raise Exl3FormatError(
            "tensor data runs past the end of the file (truncated?)",
            file=file,
            tensor=name,
            expected=f"data end <= {size}",
            found=data_base + end,
        )
    return TensorInfo(name, dtype, tuple(shape), file, data_base + begin, data_base + end)


def read_marker_u32(info: TensorInfo) -> int:
    """Read a 0-dim ``I32`` tensor's 4 bytes as a little-endian uint32 (codebook markers ``.mcg``/``.mul1``).

    exllamav3 stores the uint32 multiplier's bit pattern in an int32 tensor because safetensors had no uint32
    (exllamav3 1.6.5 ``modules/quant/exl3_lib/quantize.py`` ``codebook_markers`` L32-41).

    Raises:
        Exl3FormatError: the tensor is not a 0-dim ``I32``, or the file cannot supply the 4 bytes.
    """
    if info.dtype != "I32" or info.shape != ():
        raise Exl3FormatError(
            "codebook marker", file=info.file, tensor=info.name, expected="I32 [] (0-dim)", found=info.describe()
        )
    try:
        with _open(info.file) as handle:
            handle.seek(info.data_start)
            raw = handle.read(4)
    except OSError as exc:
        raise Exl3FormatError("cannot read marker", file=info.file, tensor=info.name, found=str(exc)) from None
    if len(raw) != 4:
        raise Exl3FormatError(
            "marker data truncated", file=info.file, tensor=info.name, expected="4 bytes", found=f"{len(raw)} bytes"
        )
    return int.from_bytes(raw, "little")


def _merge(into: dict[str, TensorInfo], more: dict[str, TensorInfo]) -> None:
    for name, info in more.items():
        if name in into:
            raise Exl3FormatError(
                "tensor stored in two files",
                file=info.file,
                tensor=name,
                expected="each tensor in exactly one file",
                found=f"also in {into[name].file}",
            )
        into[name] = info


def _read_index(index_path: Path) -> dict[str, TensorInfo]:
    file = str(index_path)
    try:
        raw = index_path.read_bytes()
    except OSError as exc:
        raise Exl3FormatError("cannot read shard index", file=file, found=str(exc)) from None
    index = _parse_json(raw, file, "invalid shard index JSON")
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise Exl3FormatError(
            "shard index", file=file, expected='{"weight_map": {tensor: file name}}', found=repr(index)[:100]
        )
    # Shard files in order of first mention; each must be a plain file name inside the checkpoint directory.
    shard_names = list(dict.fromkeys(weight_map.values()))
    for shard in shard_names:
        if not shard or Path(shard).name != shard or shard in (".", ".."):
            tensor = next(t for t, s in weight_map.items() if s == shard)
            raise Exl3FormatError(
                "shard file name", file=file, tensor=tensor, expected="a file name in the same directory", found=shard
            )
    tensors: dict[str, TensorInfo] = {}
    headers: dict[str, dict[str, TensorInfo]] = {}
    for shard in shard_names:
        shard_path = index_path.parent / shard
        if not shard_path.is_file():
            first = next(t for t, s in weight_map.items() if s == shard)
            raise Exl3FormatError(
                "missing shard file",
                file=str(shard_path),
                tensor=first,
                expected="file listed in " + INDEX_FILE,
                found="no such file",
            )
        headers[shard] = read_header(shard_path)
        _merge(tensors, headers[shard])
    for tensor, shard in weight_map.items():
        if tensor not in headers[shard]:
            raise Exl3FormatError(
                "tensor listed in the shard index is absent from its shard",
                file=str(index_path.parent / shard),
                tensor=tensor,
                expected="present in this file's header",
                found="absent",
            )
    return tensors


def list_checkpoint_tensors(path: str | os.PathLike) -> dict[str, TensorInfo]:
    """All tensors of a checkpoint, from headers only.

    Args:
        path: a ``.safetensors`` file, a ``model.safetensors.index.json``, or a directory. In a directory the
            index is used when present (only the files it names are read; every tensor it lists must be in the
            named file), else ``model.safetensors`` alone when present, else every ``*.safetensors`` file
            (sorted by name).

    Returns:
        ``{tensor name: TensorInfo}``, files in order (index order of first mention / sorted), tensors in
        header order within a file. Tensors present in a shard but missing from the index are included (the
        headers are authoritative).

    Raises:
        Exl3FormatError: no safetensors file found; a shard named by the index is missing; a tensor listed in the
            index is absent from its shard; a tensor name appears in two files; or any :func:`read_header` error.
    """
    root = Path(path)
    if root.is_file():
        if root.name.endswith(".index.json"):
            return _read_index(root)
        return read_header(root)
    if not root.is_dir():
        raise Exl3FormatError("checkpoint path", file=str(root), expected="a directory or file", found="nothing at that path")
    if (root / INDEX_FILE).is_file():
        return _read_index(root / INDEX_FILE)
    if (root / _SINGLE_FILE).is_file():
        return read_header(root / _SINGLE_FILE)
    files = sorted(p for p in root.glob("*.safetensors") if p.is_file())
    if not files:
        raise Exl3FormatError(
            "no weights", file=str(root), expected=f"{INDEX_FILE} or *.safetensors", found="no such file"
        )
    tensors: dict[str, TensorInfo] = {}
    for file in files:
        _merge(tensors, read_header(file))
    return tensors
