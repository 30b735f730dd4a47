"""The per-tensor quantize step: one planned tensor (or one shared-scale group) to a dialect's tensors.

Everything that writes or checks quantized bytes goes through :func:`quantize_tensor`: the
converter, ``verify --source``, the live Megatron export and the export validator's diagnostics,
so all of them hold the bytes the converter writes for the same contract. Fused siblings (gate/up,
q/k/v, MLA q_a/kv_a) share one FP32 outer scale: their amax is the maximum of the members'
NaN-ignoring amaxes (docs/dialects.md, "Fused siblings share the outer scale"), and they share
one calibrated input scale.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch

from fp4convert.dialects import Dialect, module_of
from fp4convert.formats import kernels
from fp4convert.formats.mxfp8 import MXFP8Tensor, quantize_mxfp8
from fp4convert.formats.nvfp4 import NVFP4Tensor, quantize_nvfp4
from fp4convert.plan.conversion import ConversionPlan
from fp4convert.plan.tensors import PlannedTensor, members_of

__all__ = [
    "SharedAmax",
    "group_input_amax",
    "input_amax",
    "member_amax",
    "quantize_members",
    "quantize_tensor",
    "shared_amax",
]


def member_amax(tensor: torch.Tensor) -> torch.Tensor:
    """One tensor's NaN-ignoring amax as a float32 scalar on its device (no host sync).

    Example:
        >>> member_amax(torch.tensor([[1.0, -3.0], [float("nan"), 2.0]])).item()
        3.0
    """
    x2d = tensor.reshape(-1, tensor.shape[-1])
    whole = kernels.tensor_amax(x2d)  # one native pass, no per-row array and torch reduction
    return whole if whole is not None else kernels.row_amax(x2d).amax()


def shared_amax(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """The outer amax fused siblings share: the maximum of the members' amaxes.

    Example:
        >>> shared_amax([torch.full((2, 16), 2.0), torch.full((2, 16), -5.0)]).item()
        5.0
    """
    return torch.stack([member_amax(t) for t in tensors]).amax()


def group_input_amax(member_names: Sequence[str], calibration: Mapping[str, float] | None) -> float | None:
    """The calibrated activation amax fused siblings share (they read the same input): the max.

    Args:
        member_names: HF tensor names of the group's members (or of one tensor).
        calibration: ``{module: activation amax}``; None when activations are per token.

    Returns:
        The largest calibrated amax among the members' modules, or None when none is known.

    Example:
        >>> names = ["m.gate_proj.weight", "m.up_proj.weight"]
        >>> group_input_amax(names, {"m.gate_proj": 3.0, "m.up_proj": 4.0})
        4.0
    """
    if calibration is None:
        return None
    values = [calibration[m] for m in map(module_of, member_names) if m in calibration]
    return max(values) if values else None


def input_amax(
    item: PlannedTensor, groups: Mapping[str, tuple[str, ...]], calibration: Mapping[str, float] | None
) -> float | None:
    """The calibrated activation amax ``item``'s input scale encodes (None: per-token placeholder)."""
    if calibration is None or item.decision.format != "nvfp4":
        return None
    return group_input_amax(members_of(groups, item), calibration)


def quantize_tensor(
    item: PlannedTensor,
    x: torch.Tensor,
    *,
    dialect: Dialect,
    profile: str,
    amax: torch.Tensor | None = None,
    input_amax: float | None = None,
    device: str | torch.device | None = None,
) -> dict[str, torch.Tensor]:
    """Quantize one planned source tensor as its decision says, and encode it as ``dialect`` stores it.

    Args:
        item: the planned tensor (info + decision).
        x: its source values (HF layout).
        dialect: the dialect whose tensor names and scale conventions are used.
        profile: the contract's quantizer profile (``te``, ``te-2.13``, ``modelopt``).
        amax: the outer amax to impose (a shared-scale group's); None measures the tensor's own.
        input_amax: the calibrated activation amax (None: the per-token placeholder).
        device: where to quantize; default ``x``'s device. Bytes are the same everywhere.

    Returns:
        Output tensor name -> tensor, in the dialect's order (``x`` itself for a BF16 tensor).
    """
    q: NVFP4Tensor | MXFP8Tensor | None = None
    if item.quantized:
        x = x.to(device if device is not None else x.device)
        if item.decision.format == "mxfp8":
            q = quantize_mxfp8(x)
        else:
            tile = getattr(item.decision.recipe, "tile", "1x16")
            q = quantize_nvfp4(x, tile=tile, amax=None if amax is None else amax.to(x.device), profile=profile)  # type: ignore[arg-type]
    return dialect.encode(item, q, x, input_amax)


def quantize_members(
    items: Sequence[PlannedTensor],
    tensors: Sequence[torch.Tensor],
    *,
    dialect: Dialect,
    profile: str,
    input_amax: float | None = None,
    amax: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """Quantize one tensor or one whole shared-scale group, and encode it as ``dialect`` writes it.

    With two or more NVFP4 members the outer amax is :func:`shared_amax` of all of them, exactly
    as the converter computes it; a single tensor uses its own amax. BF16 members come back as
    they are. Quantization runs on each tensor's own device.

    Args:
        items: the planned tensors, in output order; one fused group at most.
        tensors: their source tensors (HF layout), in the same order.
        dialect: the on-disk / on-wire dialect whose tensor names and scale conventions are used.
        profile: the contract's quantizer profile.
        input_amax: the group's calibrated activation amax (None: per-token placeholder).
        amax: impose this outer amax instead (diagnostics use it to replay an exporter's mistake).

    Returns:
        Output tensor name -> tensor, in the dialect's order, members in ``items`` order.

    Example:
        >>> from fp4convert.contract import load_contract
        >>> from fp4convert.dialects import get_dialect
        >>> from fp4convert.families import describe_name, load_config
        >>> config = load_config("Qwen3-30B-A3B")
        >>> contract = load_contract("nvfp4-experts-per-token")
        >>> names = [f"model.layers.0.mlp.experts.0.{p}_proj.weight" for p in ("gate", "up")]
        >>> items = [PlannedTensor(i, contract.decide(i, num_layers=48))
        ...          for i in (describe_name(n, config) for n in names)]
        >>> out = quantize_members(items, [torch.ones(4, 16), torch.full((4, 16), 2.0)],
        ...                        dialect=get_dialect("modelopt"), profile="te")
        >>> scales = [out[f"model.layers.0.mlp.experts.0.{p}_proj.weight_scale_2"] for p in ("gate", "up")]
        >>> torch.equal(scales[0], scales[1]), f"{scales[0].item():.6g}"  # rn(1 / rn(2688 / 2))
        (True, '0.000744048')
    """
    if amax is None and len(items) > 1 and all(i.quantized and i.decision.format == "nvfp4" for i in items):
        amax = shared_amax(tensors)
    out: dict[str, torch.Tensor] = {}
    for item, x in zip(items, tensors, strict=True):
        out.update(quantize_tensor(item, x, dialect=dialect, profile=profile, amax=amax, input_amax=input_amax))
    return out


class SharedAmax:
    """One outer amax per shared-scale group of a conversion: the max over its members, each read
    once. Members read early (to compute the amax) and stored in the same source shard are kept
    until their turn comes, so streaming never reads a tensor twice.

    Args:
        plan: the conversion plan (its groups and source shards).
        fetch: reads a source tensor by name (from the read-ahead when it is there).
    """

    def __init__(self, plan: ConversionPlan, fetch: Callable[[str], torch.Tensor]) -> None:
        self.plan = plan
        self.fetch = fetch
        self._values: dict[str, torch.Tensor] = {}
        self._pending: dict[str, torch.Tensor] = {}  # members read early, waiting for their turn
        self._items = {item.info.name: item for item in plan.items}

    def amax_for(self, item: PlannedTensor, x: torch.Tensor) -> torch.Tensor | None:
        """The shared amax of ``item``'s group (None: not shared, the quantizer measures it)."""
        group = item.decision.fused_group
        if group is None or group not in self.plan.groups or item.decision.format != "nvfp4":
            return None
        if group not in self._values:
            amaxes = []
            for name in self.plan.groups[group]:
                t = x if name == item.info.name else self._pending.get(name)
                if t is None:
                    t = self.fetch(name)
                    if self._items[name].source_file == item.source_file:
                        self._pending[name] = t  # same shard: it comes up soon, do not read it twice
                amaxes.append(member_amax(t))
            self._values[group] = torch.stack(amaxes).amax()
        return self._values[group]

    def waiting(self, name: str) -> bool:
        """Whether ``name`` was read early and is held for its turn."""
        return name in self._pending

    def take(self, name: str) -> torch.Tensor | None:
        """The tensor read early for ``name``, handed over once (None if it was not read early)."""
        return self._pending.pop(name, None)
