"""Live weight export: Megatron-named BF16 parameters in, the sampler's HF-named tensors out.

This is what an RL framework runs after every update (docs/live-export.md): take the
learner's parameters (tensor-parallel shards already gathered, expert ids local to the EP rank),
apply the family transforms (QKV split per query group, ``linear_fc1`` into gate/up, local expert
ids to global ones), quantize every tensor exactly as the contract and the converter do, and hand
over the tensors of the chosen dialect. Every group's members share one outer amax.

:func:`export_hf` is the one-call form of :class:`~fp4convert.megatron.sync.LiveExporter`, which
it keeps per (contract, model, dialect, EP position), so a training loop calling it every sync
builds the plan, the name resolution and the output buffers once. Parameters the caller already
holds (a dict, its ``items()``, a list) are one whole update, in plan order: on a GPU, from the
third sync with the same parameters on, a replay of the CUDA graph the second one captured.
Parameters from an iterator (``model.named_parameters()``, a generator gathering shards) are
consumed lazily: a high-precision tensor is yielded when it arrives, the routed experts of one
layer and format when the layer's last expert tensor arrived (one launch quantizes them all), any
other shared-scale group when its last member arrived (MLA's ``q_a_proj`` / ``kv_a_proj_with_mqa``
wait for each other). Outputs are views of the exporter's buffers; buffers still referenced by the
caller are never overwritten (a new set is used instead).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch

from fp4convert.contract import contract_hash
from fp4convert.megatron.plan import ContractLike, DialectLike, loaded_contract
from fp4convert.megatron.sync import LiveExporter, held_whole

__all__ = ["export_hf"]

_EXPORTERS: OrderedDict[tuple[Any, ...], LiveExporter] = OrderedDict()
_CACHE_SIZE = 4


def _exporter(contract: ContractLike, config: Mapping[str, Any], **kwargs: Any) -> LiveExporter:
    the_contract = loaded_contract(contract)
    key = (
        contract_hash(the_contract),
        json.dumps(dict(config), sort_keys=True, default=str),
        *(
            getattr(v, "name", v)
            if k == "dialect"
            else (None if v is None else repr(sorted(v.items())) if isinstance(v, Mapping) else v)
            for k, v in sorted(kwargs.items())
        ),
    )
    exporter = _EXPORTERS.get(key)
    if exporter is None:
        exporter = LiveExporter(contract=the_contract, config=config, **kwargs)
        _EXPORTERS[key] = exporter
        while len(_EXPORTERS) > _CACHE_SIZE:
            _EXPORTERS.popitem(last=False)
    _EXPORTERS.move_to_end(key)
    return exporter


def export_hf(
    named_params: Iterable[tuple[str, torch.Tensor]] | Mapping[str, torch.Tensor],
    *,
    contract: ContractLike,
    family: str | None,
    config: Mapping[str, Any],
    dialect: DialectLike = "modelopt",
    ep_rank: int = 0,
    ep_size: int = 1,
    include_input_scale: bool = False,
    calibration: Mapping[str, float] | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Export Megatron parameters as the HF tensors of a dialect, quantized under a contract.

    The result is exactly what a sampler receives in a live update, and byte for byte what
    ``fp4convert convert`` writes for the same tensors (``validate_export`` proves it for any
    exporter). Quantization runs on each tensor's own device (CPU or CUDA, same bytes).

    ``input_scale`` is not sent by default: RL frameworks (Miles' ``quantize_params_nvfp4``) never
    re-send NVFP4 activation scales during live updates, the engine keeps the one it loaded from
    the converted checkpoint. ``include_input_scale=True`` sends them too (per-token contracts:
    the 1.0 placeholder; per-tensor contracts need ``calibration``).

    Args:
        named_params: ``(name, tensor)`` pairs or a mapping; Megatron-Core names (``module.``
            wrappers allowed, TEGroupedMLP or SequentialMLP experts), TP-gathered BF16 tensors.
            An iterator is consumed lazily, one at a time; a collection is taken whole.
        contract: a :class:`~fp4convert.contract.Contract`, a contract file or a shipped name.
        family: family key (``"qwen3_moe"``); None takes it from ``config``.
        config: the model's config.json.
        dialect: ``modelopt``, ``sglang-mxfp8`` or ``compressed-tensors`` (or a dialect instance).
        ep_rank: expert-parallel rank the parameters come from (their expert ids are local to it).
        ep_size: expert-parallel size.
        include_input_scale: also send NVFP4 activation scales (see above).
        calibration: activation amax per HF module, for per-tensor activation contracts.

    Yields:
        ``(HF name, tensor)`` in the dialect's layout: from an iterator each group's tensors as
        soon as it is complete, from a collection in plan order; e.g.
        ``...experts.7.gate_proj.weight`` (U8), ``...weight_scale`` (E4M3), ``...weight_scale_2``
        (F32), then the same for ``up_proj``.

    Raises:
        ConversionError: the contract cannot be exported in this dialect (raised at the first
            ``next()``, before anything is yielded).
        MappingError: an unmapped name, a tensor whose shape does not fit the config (not TP
            gathered?), an expert id outside the EP rank, or a group left incomplete at the end.

    Example (not run: it needs a model's state dict and config):
        >>> megatron = hf_to_megatron(hf_state_dict, "qwen3_moe", config)  # doctest: +SKIP
        >>> for name, tensor in export_hf(megatron.items(), contract="nvfp4-experts-per-token",
        ...                               family="qwen3_moe", config=config):  # doctest: +SKIP
        ...     engine.update_weight(name, tensor)
    """
    exporter = _exporter(
        contract,
        config,
        dialect=dialect,
        family=family,
        ep_rank=ep_rank,
        ep_size=ep_size,
        include_input_scale=include_input_scale,
        calibration=calibration,
        device=None,  # its buffers are made where the parameters at hand are, in this first call
    )
    if held_whole(named_params):  # everything is here already: one whole update, replayed from the third sync on
        yield from exporter(named_params)
    else:
        yield from exporter.stream(named_params)
