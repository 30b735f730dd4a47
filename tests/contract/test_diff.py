"""``diff``: changed tensors per layer, and the byte accounting behind it."""

from __future__ import annotations

import pytest
from contract.helpers import CONTRACTS, make_contract, rule

from fp4convert.contract import Decision, MXFP8Recipe, NVFP4Recipe, load_contract
from fp4convert.contract.diff import diff_contracts
from fp4convert.contract.footprint import fits_blocks, storage_bytes
from fp4convert.errors import MappingError
from fp4convert.inventory import ModelInventory, Role, TensorInfo

WEIGHT = TensorInfo("w", (256, 128), gemm_weight=True)


def _decision(fmt: str, recipe: NVFP4Recipe | MXFP8Recipe | None) -> Decision:
    return Decision("w", fmt, recipe, "rules[0]", "", ())  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("tensor", "decision", "expected"),
    [
        (WEIGHT, _decision("bf16", None), 2 * 256 * 128),
        # 2 values per byte, one E4M3 scale per 16 values of a row, one FP32 outer scale
        (WEIGHT, _decision("nvfp4", NVFP4Recipe()), 256 * 128 // 2 + 256 * 8 + 4),
        (WEIGHT, _decision("nvfp4", NVFP4Recipe(weight_scale_scope="row")), 16384 + 2048 + 256 * 4),
        # a 3-D grouped tensor [experts, rows, cols] with one outer scale per expert
        (
            TensorInfo("w", (8, 64, 128), gemm_weight=True),
            _decision("nvfp4", NVFP4Recipe(weight_scale_scope="expert")),
            8 * 64 * 128 // 2 + 8 * 64 * 8 + 8 * 4,
        ),
        # one byte per value, one E8M0 scale per 32 values of a row
        (WEIGHT, _decision("mxfp8", MXFP8Recipe()), 256 * 128 + 256 * 4),
        # not a GEMM weight: kept in its checkpoint dtype
        (TensorInfo("bias", (64,), dtype="float32", role=Role.ROUTER), _decision("bf16", None), 256),
        # a row that does not fill its last block still pays for the block's scale
        (TensorInfo("w", (2, 40), gemm_weight=True), _decision("mxfp8", MXFP8Recipe()), 80 + 2 * 2),
    ],
)
def test_storage_bytes(tensor: TensorInfo, decision: Decision, expected: int) -> None:
    assert storage_bytes(tensor, decision) == expected


def test_storage_bytes_needs_a_shape_and_a_known_dtype() -> None:
    with pytest.raises(MappingError, match=r"^tensor 'w' has no shape, so its size is unknown"):
        storage_bytes(TensorInfo("w", gemm_weight=True), _decision("bf16", None))
    with pytest.raises(MappingError, match=r"^tensor 'n' has unknown dtype 'complex32'"):
        storage_bytes(TensorInfo("n", (4,), dtype="complex32"), _decision("bf16", None))


def test_fits_blocks() -> None:
    assert fits_blocks((4096, 7168), (1, 16))
    assert not fits_blocks((4096, 11000), (1, 16))
    assert fits_blocks((48, 64), (16, 16))
    assert not fits_blocks((40, 64), (16, 16))
    assert not fits_blocks((), (1, 32))


def test_diff_between_shipped_contracts_on_a_toy_model(toy_moe: ModelInventory) -> None:
    result = diff_contracts(
        load_contract(CONTRACTS / "bf16-all.yaml"),
        load_contract(CONTRACTS / "nvfp4-experts-per-token.yaml"),
        toy_moe,
    )
    assert (result.before, result.after, result.family) == (
        "bf16-all",
        "nvfp4-experts-per-token",
        "toy_qwen3_moe",
    )
    assert [layer.layer for layer in result.layers] == [0, 1, 2, 3]
    # Each layer: norms 2x128 + q_norm/k_norm 2x32, q 8192, k 4096, v 4096, o 8192, router 512,
    # and 12 expert weights of 32x64: 4096 bytes each in bf16, 32*64/2 + 32*4 + 4 = 1156 in NVFP4.
    for layer in result.layers:
        assert len(layer.changes) == 12
        assert (layer.bytes_before, layer.bytes_after) == (74560, 74560 - 12 * 4096 + 12 * 1156)
    first = result.layers[0].changes[0]
    assert (first.tensor, first.before, first.after) == (
        "model.layers.0.mlp.experts.0.gate_proj.weight",
        "bf16",
        "nvfp4",
    )
    assert (first.rule_before, first.rule_after) == ("rules[0]", "rules[1]")
    assert (first.bytes_before, first.bytes_after) == (4096, 1156)
    outside = 128 * 64 * 2 * 2 + 64 * 2  # embedding, lm_head, final norm
    assert result.total_before == 4 * 74560 + outside
    assert result.total_after == 4 * (74560 - 12 * (4096 - 1156)) + outside


def test_diff_reports_recipe_changes_within_a_format(toy_moe: ModelInventory) -> None:
    a = make_contract()
    b = make_contract(formats={"nvfp4": {"tile": "16x16", "weight_scale_scope": "row"}})
    result = diff_contracts(a, b, toy_moe)
    assert len(result.changes) == 48
    change = result.changes[0]
    assert (change.before, change.after) == ("nvfp4", "nvfp4")
    assert change.recipe_change == "tile: 1x16 -> 16x16, weight_scale_scope: tensor -> row"
    assert change.bytes_after - change.bytes_before == 32 * 4 - 4  # one outer scale per row


def test_identical_contracts_have_no_changes(toy_mla: ModelInventory) -> None:
    contract = make_contract(rules=[rule("*", "mxfp8")])
    result = diff_contracts(contract, contract, toy_mla)
    assert result.layers == ()
    assert result.total_before == result.total_after


def test_diff_to_json(toy_moe: ModelInventory) -> None:
    a = make_contract()
    b = make_contract(bf16_exceptions={"last_layers": 1})
    data = diff_contracts(a, b, toy_moe).to_json()
    assert data["changed_tensors"] == 12
    assert data["model"] == {"family": "toy_qwen3_moe", "num_layers": 4, "num_tensors": 87}
    assert [layer["layer"] for layer in data["layers"]] == [3]
    assert data["layers"][0]["changes"][0] == {
        "tensor": "model.layers.3.mlp.experts.0.gate_proj.weight",
        "before": "nvfp4",
        "after": "bf16",
        "rule_before": "rules[0]",
        "rule_after": "bf16_exceptions.last_layers",
        "recipe_change": "",
        "bytes_before": 1156,
        "bytes_after": 4096,
    }
