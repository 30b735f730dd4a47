"""``formats.nvfp4.four_over_six``: the contract field, its profile, emit, diff and the hash."""

from __future__ import annotations

import pytest
import yaml
from click.testing import CliRunner
from contract.helpers import CONTRACTS, TOY_MOE, base_contract

from fp4convert.cli import cli
from fp4convert.contract import Contract, contract_hash, load_contract, parse_contract
from fp4convert.contract.diff import diff_contracts
from fp4convert.contract.emit import emit
from fp4convert.errors import ContractError
from fp4convert.formats import profiles
from fp4convert.model_source import load_model_inventory

PER_TOKEN = CONTRACTS / "nvfp4-experts-per-token.yaml"


def _with_four_over_six(mode: str | None, bound: int | None, **nvfp4: object) -> Contract:
    recipe = {"four_over_six": mode, "four_over_six_e4m3_max": bound, **nvfp4}
    return Contract.model_validate(base_contract(formats={"nvfp4": recipe}))


@pytest.mark.parametrize("mode", ["mae", "mse"])
@pytest.mark.parametrize("bound", [448, 256])
def test_the_contract_names_the_numeric_core_profile(mode, bound):
    contract = _with_four_over_six(mode, bound)
    assert contract.nvfp4_profile == profiles.four_over_six_profile(mode, bound)
    assert contract.nvfp4_profile in profiles.FOUR_OVER_SIX_PROFILES


def test_without_four_over_six_the_profile_is_the_quantizer():
    assert Contract.model_validate(base_contract(quantizer="te-2.13")).nvfp4_profile == "te-2.13"


@pytest.mark.parametrize(
    ("nvfp4", "message"),
    [
        ({"four_over_six": "mse"}, "four_over_six needs four_over_six_e4m3_max: 256"),
        ({"four_over_six_e4m3_max": 256}, "four_over_six_e4m3_max is set but four_over_six is not"),
        ({"four_over_six": "mse", "four_over_six_e4m3_max": 300}, "found 300, expected 256 or 448"),
        ({"four_over_six": "mse", "four_over_six_e4m3_max": 256.0}, "expected 256 or 448, found 256.0"),
        ({"four_over_six": "max", "four_over_six_e4m3_max": 256}, "found 'max', expected 'mae' or 'mse'"),
    ],
)
def test_bad_four_over_six_fields_are_one_clear_error(nvfp4, message):
    text = yaml.safe_dump(base_contract(formats={"nvfp4": nvfp4}), sort_keys=False)
    with pytest.raises(ContractError, match=r"formats\.nvfp4") as err:
        parse_contract(text, source="c.yaml")
    assert message in str(err.value)


def test_four_over_six_needs_te_arithmetic():
    data = base_contract(
        quantizer="modelopt", formats={"nvfp4": {"four_over_six": "mae", "four_over_six_e4m3_max": 448}}
    )
    with pytest.raises(ContractError, match=r"needs quantizer 'te', not 'modelopt'"):
        parse_contract(yaml.safe_dump(data, sort_keys=False), source="c.yaml")


def test_contracts_without_the_new_fields_keep_their_hash_and_round_trip():
    plain = load_contract(PER_TOKEN)
    assert "four_over_six" not in plain.canonical_dict()["formats"]["nvfp4"]
    data = plain.canonical_dict()
    data["formats"]["nvfp4"] |= {"four_over_six": "mse", "four_over_six_e4m3_max": 256}
    four = Contract.model_validate(data)
    assert contract_hash(four) != contract_hash(plain)
    assert Contract.model_validate(yaml.safe_load(four.to_yaml())) == four


@pytest.mark.parametrize(("mode", "bound"), [("mae", 448), ("mse", 256)])
def test_emit_env_gives_te_and_flashinfer_the_same_mode_and_bound(mode, bound):
    out = emit(_with_four_over_six(mode, bound), "env")
    lines = out.text.splitlines()
    upper, te_256, fi_256 = mode.upper(), "all" if bound == 256 else "none", int(bound == 256)
    assert lines[-8:] == [
        "NVTE_NVFP4_4OVER6=all",
        f"NVTE_NVFP4_4OVER6_ERR_MODE={upper}",
        f"NVTE_NVFP4_4OVER6_E4M3_USE_256={te_256}",
        "NVTE_NVFP4_4OVER6_ERR_USE_FAST_MATH=0",
        "FLASHINFER_NVFP4_4OVER6=1",
        f"FLASHINFER_NVFP4_4OVER6_ERR_MODE={upper}",
        f"FLASHINFER_NVFP4_4OVER6_E4M3_USE_256={fi_256}",
        "FLASHINFER_NVFP4_4OVER6_ERR_USE_FAST_MATH=0",
    ]
    assert "NVTE_NVFP4_DISABLE_RHT=1" in lines  # TE refuses 4over6 with RHT
    assert any("FlashInfer scores a per-tensor block's candidates" in note for note in out.notes)


def test_emit_env_notes_what_could_not_be_confirmed_for_per_token_activations():
    out = emit(_with_four_over_six("mse", 256, per_token_activations=True), "env")
    assert any("not confirmed" in note and "column-wise copy" in note for note in out.notes)


def test_emit_env_without_four_over_six_has_no_4over6_switches():
    assert "4OVER6" not in emit(load_contract(PER_TOKEN), "env").text


def test_diff_shows_a_four_over_six_change_on_every_nvfp4_tensor():
    before = load_contract(PER_TOKEN)
    data = before.canonical_dict()
    data["name"] = "per-token-4over6"
    data["formats"]["nvfp4"] |= {"four_over_six": "mse", "four_over_six_e4m3_max": 256}
    after = Contract.model_validate(data)
    inventory = load_model_inventory(str(TOY_MOE))
    result = diff_contracts(before, after, inventory)
    nvfp4 = [t for t in inventory if before.decide_all(inventory)[t.name].format == "nvfp4"]
    assert len(result.changes) == len(nvfp4) > 0
    assert {c.recipe_change for c in result.changes} == {
        "four_over_six: None -> mse, four_over_six_e4m3_max: None -> 256"
    }
    assert result.total_before == result.total_after  # same storage, other bytes


def test_diff_cli_prints_the_recipe_change(tmp_path):
    data = load_contract(PER_TOKEN).canonical_dict()
    data["name"] = "per-token-4over6"
    data["formats"]["nvfp4"] |= {"four_over_six": "mae", "four_over_six_e4m3_max": 448}
    path = tmp_path / "four.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    result = CliRunner().invoke(cli, ["diff", str(PER_TOKEN), str(path), "--model", str(TOY_MOE)])
    assert result.exit_code == 0
    assert "nvfp4 -> nvfp4 (four_over_six: None -> mae, four_over_six_e4m3_max: None -> 448)" in result.stdout
