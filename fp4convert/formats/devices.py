"""Where tensors are quantized: ``cpu``, ``cuda`` or ``cuda:N``, checked before any work starts.

The bytes are the same on every device (the kernels are tested against one reference), so the
device is only a speed choice; a misspelled or absent one is refused up front with what exists,
instead of failing inside torch half-way through a conversion.
"""

from __future__ import annotations

import re

import torch

from fp4convert.errors import ConversionError

__all__ = ["check_device", "current_cuda_device", "tensor_device"]

_DEVICE = re.compile(r"^(cpu|cuda)(?::(\d+))?$")


def check_device(device: str) -> str:
    """``device`` itself when it names a usable device.

    Raises:
        ConversionError: not ``cpu``, ``cuda`` or ``cuda:N``, or a CUDA device this machine lacks.

    Example:
        >>> check_device("cpu")
        'cpu'
        >>> check_device("gpu")
        Traceback (most recent call last):
        ...
        fp4convert.errors.ConversionError: device 'gpu' (--device gpu) is not cpu, cuda or cuda:N; ...
    """
    match = _DEVICE.match(device) if isinstance(device, str) else None
    if match is None:
        raise ConversionError(
            f"device {device!r} (--device {device}) is not cpu, cuda or cuda:N",
            hint="use device='cpu' (--device cpu), or cuda / cuda:1 on a machine with NVIDIA GPUs",
            field="device",
        )
    if match.group(1) == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        index = int(match.group(2) or 0)
        if index >= count:
            have = f"{count} CUDA device(s)" if count else "no CUDA device"
            raise ConversionError(
                f"device {device!r} (--device {device}) was asked for, but this machine has {have}",
                hint="use device='cpu' (--device cpu): the bytes are the same",
                field="device",
            )
    return device


def tensor_device(device: str | torch.device) -> torch.device:
    """``device`` checked (:func:`check_device`) and named as its tensors name it (``cuda`` ->
    ``cuda:N``, the current device): what tables made for it at construction are found by.

    Example:
        >>> tensor_device("cpu")
        device(type='cpu')
    """
    check_device(str(device))
    return torch.empty(0, device=device).device


def current_cuda_device() -> torch.device | None:
    """The current CUDA device where CUDA is available, else None: where a GPU process's weights
    live when it says nothing else (TransformerEngine's modules default to ``device="cuda"`` too).

    Example:
        >>> current_cuda_device() is None or current_cuda_device().type == "cuda"
        True
    """
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else None
