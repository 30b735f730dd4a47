"""Every exception fp4convert raises on purpose.

One root, :class:`Fp4ConvertError`, and a few subclasses, each also inheriting the closest built-in
so callers that catch ``ValueError`` / ``KeyError`` keep working. A message says what was found,
what was expected and what to do next; structured fields (``tensor``, ``file``, ``field``,
``expected``, ``found``) let the CLI and tests inspect errors without parsing text.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "CheckpointError",
    "ContractError",
    "ConversionError",
    "DistributedError",
    "FormatError",
    "Fp4ConvertError",
    "HubError",
    "MappingError",
    "VerificationError",
]


class Fp4ConvertError(Exception):
    """Root of every error fp4convert raises deliberately.

    Args:
        message: what was found and what was expected, in one sentence.
        hint: what the user should do next (shown after the message).
        **fields: structured context (``tensor=...``, ``file=...``, ``field=...``).
    """

    code = "fp4convert"

    def __init__(self, message: str, *, hint: str | None = None, **fields: Any) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.fields = fields
        for key, value in fields.items():
            setattr(self, key, value)

    def __str__(self) -> str:
        return f"{self.message}; {self.hint}" if self.hint else self.message


class ContractError(Fp4ConvertError, ValueError):
    """A precision contract is malformed or cannot hold (file, line and field are named)."""

    code = "contract"


class FormatError(Fp4ConvertError, ValueError):
    """A tensor cannot be quantized as asked: shape, dtype or block size does not fit."""

    code = "format"


class MappingError(Fp4ConvertError, KeyError):
    """A tensor name or model family is unknown, unmapped or ambiguous."""

    code = "mapping"

    # KeyError.__str__ would repr() the message; keep it readable.
    __str__ = Fp4ConvertError.__str__


class CheckpointError(Fp4ConvertError, OSError):
    """A checkpoint on disk is missing, unreadable, or not what its index says."""

    code = "checkpoint"

    __str__ = Fp4ConvertError.__str__


class ConversionError(Fp4ConvertError, RuntimeError):
    """A conversion was refused or could not complete."""

    code = "conversion"


class DistributedError(Fp4ConvertError, RuntimeError):
    """A run split across ranks cannot go on: a rank failed or stopped responding, or the ranks disagree.

    ``rank`` names the rank at fault (None when the ranks disagree with each other).
    """

    code = "distributed"


class VerificationError(Fp4ConvertError, AssertionError):
    """Bytes, structure or scales differ from what the contract and the reference quantizer give."""

    code = "verification"


class HubError(Fp4ConvertError, RuntimeError):
    """A Hugging Face Hub download or upload failed or was refused."""

    code = "hub"
