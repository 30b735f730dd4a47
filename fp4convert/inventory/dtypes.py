"""The one dtype table: torch dtype names, safetensors dtype codes and torch dtypes, side by side.

A :class:`~fp4convert.inventory.TensorInfo` carries its dtype as a torch dtype name
(``"bfloat16"``); a safetensors header spells it as a code (``"BF16"``). Every lookup between the
two, and to a ``torch.dtype`` and its size, goes through this table.

Example:
    >>> torch_dtype("BF16") is torch_dtype("bfloat16") is torch.bfloat16
    True
    >>> safetensors_code(torch.float8_e8m0fnu), torch_name(torch.float8_e4m3fn), torch_dtype("half")
    ('F8_E8M0', 'float8_e4m3fn', torch.float16)
"""

from __future__ import annotations

import torch

__all__ = ["SAFETENSORS_DTYPES", "itemsize", "safetensors_code", "torch_dtype", "torch_name"]

# (safetensors code, torch dtype name), in the safetensors format's own order.
_TABLE: tuple[tuple[str, str], ...] = (
    ("BOOL", "bool"),
    ("U8", "uint8"),
    ("I8", "int8"),
    ("I16", "int16"),
    ("U16", "uint16"),
    ("I32", "int32"),
    ("U32", "uint32"),
    ("I64", "int64"),
    ("U64", "uint64"),
    ("F16", "float16"),
    ("BF16", "bfloat16"),
    ("F32", "float32"),
    ("F64", "float64"),
    ("F8_E4M3", "float8_e4m3fn"),
    ("F8_E5M2", "float8_e5m2"),
    ("F8_E8M0", "float8_e8m0fnu"),
)

#: safetensors dtype code -> torch dtype (codes this torch build has a dtype for)
SAFETENSORS_DTYPES: dict[str, torch.dtype] = {
    code: getattr(torch, name) for code, name in _TABLE if isinstance(getattr(torch, name, None), torch.dtype)
}
_BY_NAME: dict[str, torch.dtype] = {
    name: SAFETENSORS_DTYPES[code] for code, name in _TABLE if code in SAFETENSORS_DTYPES
}
_CODES: dict[torch.dtype, str] = {dtype: code for code, dtype in SAFETENSORS_DTYPES.items()}


def torch_dtype(name: str) -> torch.dtype | None:
    """The torch dtype for a safetensors code (``"BF16"``) or a torch dtype name (``"bfloat16"``,
    ``"torch.bfloat16"``, or an alias torch itself knows, such as ``"half"``); None for anything else.
    """
    found = SAFETENSORS_DTYPES.get(name) or _BY_NAME.get(name.removeprefix("torch."))
    if found is None:
        alias = getattr(torch, name.removeprefix("torch."), None)
        found = alias if isinstance(alias, torch.dtype) else None
    return found


def safetensors_code(dtype: torch.dtype) -> str | None:
    """The safetensors code of a torch dtype (``torch.bfloat16`` -> ``"BF16"``); None if it has none."""
    return _CODES.get(dtype)


def torch_name(dtype: torch.dtype) -> str:
    """The torch dtype name a :class:`~fp4convert.inventory.TensorInfo` carries (``"bfloat16"``)."""
    return str(dtype).removeprefix("torch.")


def itemsize(name: str) -> int | None:
    """Bytes per element of a dtype named either way; None for an unknown name.

    Example:
        >>> itemsize("F8_E4M3"), itemsize("float32"), itemsize("int40")
        (1, 4, None)
    """
    dtype = torch_dtype(name)
    return None if dtype is None else dtype.itemsize
