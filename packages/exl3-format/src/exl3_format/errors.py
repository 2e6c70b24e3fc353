"""The single exception type raised for malformed EXL3 checkpoints.

Every problem found in a checkpoint (unreadable or truncated file, invalid header, shapes that disagree, unknown
dtype, missing shard, illegal tensor-parallel split requested with ``plan_linear_tp``) surfaces as
:class:`Exl3FormatError`, never as a bare ``KeyError``/``json.JSONDecodeError``/``OSError``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Exl3FormatError"]


class Exl3FormatError(ValueError):
    """A checkpoint (or a request about it) violates the EXL3 format rules.

    Attributes:
        what: short description of the rule that failed, e.g. ``"trellis shape"``.
        file: path of the offending file, or ``None`` when no single file is involved.
        tensor: tensor (or module key) name, or ``None``.
        expected: what the rule requires (free text, e.g. ``"[16, 32, 64] I16"``), or ``None``.
        found: what the checkpoint holds, or ``None``.

    The message names all of those that are known::

        /ckpt/model.safetensors: tensor 'model.layers.0.mlp.down_proj.trellis': trellis dtype:
        expected I16, found F16
    """

    def __init__(
        self,
        what: str,
        *,
        file: str | None = None,
        tensor: str | None = None,
        expected: Any = None,
        found: Any = None,
    ) -> None:
        self.what = what
        self.file = None if file is None else str(file)
        self.tensor = tensor
        self.expected = expected
        self.found = found
        super().__init__(self._message())

    def _message(self) -> str:
        parts = []
        if self.file is not None:
            parts.append(f"{self.file}:")
        if self.tensor is not None:
            parts.append(f"tensor {self.tensor!r}:")
        text = " ".join([*parts, self.what])
        details = []
        if self.expected is not None:
            details.append(f"expected {self.expected}")
        if self.found is not None:
            details.append(f"found {self.found}")
        if details:
            text += ": " + ", ".join(details)
        return text

    def __reduce__(self):  # keep the keyword attributes across pickling (multiprocessing, pytest-xdist)
        return (
            _rebuild,
            (self.what, self.file, self.tensor, self.expected, self.found),
        )


def _rebuild(what, file, tensor, expected, found) -> Exl3FormatError:
    return Exl3FormatError(what, file=file, tensor=tensor, expected=expected, found=found)
