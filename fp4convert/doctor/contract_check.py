"""``--contract``: every tensor's format and exceptions against a precision contract.

The contract decides each logical weight exactly as it would for a conversion (rules, BF16
exceptions, default; :meth:`fp4convert.contract.Contract.decide_all`), and each disagreement
with the stored format is reported with the entry that decided: "stored nvfp4, but
``bf16_exceptions.lm_head`` keeps it bf16". The activation mode is checked too: a per-token
contract stores 1.0 placeholders (ModelOpt) or no activation scale (compressed-tensors), a
calibrated one stores a real scale for every NVFP4 module.
"""

from __future__ import annotations

from fp4convert.contract import Contract
from fp4convert.doctor.model import Model
from fp4convert.doctor.report import Finding
from fp4convert.doctor.scales import ScaleValues
from fp4convert.errors import ContractError

__all__ = ["check_contract"]


def check_contract(contract: Contract, model: Model, values: ScaleValues | None) -> list[Finding]:
    """The findings of the module docstring (``values`` None: headers only, activations not checked)."""
    try:
        decisions = contract.decide_all(model.inventory())
    except ContractError as exc:
        return [
            Finding(
                "contract",
                "contract-not-applicable",
                "error",
                f"contract {contract.name!r} cannot be applied to this model: {exc.message}",
                fix=exc.hint or "fix the contract",
            )
        ]
    broken: dict[tuple[str, str, str], list[str]] = {}
    for module in model.gemm_modules():
        stored = model.modules[module].format
        decision = decisions.get(f"{module}.weight")
        if decision is None or stored in ("absent", "other") or decision.format == stored:
            continue
        broken.setdefault((decision.rule, decision.format, stored), []).append(module)
    findings = [
        Finding(
            "contract",
            "contract-format",
            "error",
            f"stored {stored}, but contract {contract.name!r} gives {expected} ({rule})",
            tuple(modules),
            fix="re-convert under the contract (fp4convert convert), or change the contract",
        )
        for (rule, expected, stored), modules in sorted(broken.items())
    ]
    if values is not None:
        nvfp4 = [
            m
            for m in model.gemm_modules()
            if model.modules[m].format == "nvfp4"
            and (d := decisions.get(f"{m}.weight")) is not None
            and d.format == "nvfp4"
        ]
        findings += _activation_mode(contract, nvfp4, values)
    return findings


def _activation_mode(contract: Contract, nvfp4: list[str], values: ScaleValues) -> list[Finding]:
    """The NVFP4 modules both stored and decided NVFP4 against the contract's activation mode."""
    per_token = contract.formats.nvfp4.per_token_activations
    stored = {m: values.stored(m, "input") for m in nvfp4}
    dialect = values.prefer
    if per_token:
        # ModelOpt writes the 1.0 placeholder, compressed-tensors no activation scale at all
        wrong = [m for m, v in stored.items() if (v is not None and v != 1.0) or (v is None and dialect == "modelopt")]
        what = "a per-token contract stores 1.0 placeholders (modelopt) or no activation scale (compressed-tensors)"
    else:
        wrong = [m for m, v in stored.items() if v is None or v == 1.0]
        what = "a calibrated contract stores a calibrated activation scale for every NVFP4 module"
    if not wrong:
        return []
    return [
        Finding(
            "contract",
            "contract-activations",
            "error",
            f"activation scales do not follow contract {contract.name!r}: {what}",
            tuple(sorted(wrong)),
            fix="re-convert under the contract (with --calibration for a calibrated one)",
        )
    ]
