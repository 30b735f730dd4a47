"""Loading contract files: safe YAML/JSON, and one-line errors naming file, line and field."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from fp4convert.contract import load_contract, parse_contract
from fp4convert.errors import ContractError

# Line numbers below refer to this text (line 1 is "version: 1").
GOOD = """\
version: 1
name: test
default: bf16
formats:
  nvfp4:
    tile: 1x16
rules:
  - kind: glob
    namespace: hf
    pattern: "*.mlp.experts.*"
    format: nvfp4
bf16_exceptions:
  last_layers: 2
"""
RULES_HINT = "a contract needs at least one rule, e.g. {kind: glob, namespace: hf, pattern: '*', format: bf16}"
RULES_BLOCK = GOOD[GOOD.index("rules:") : GOOD.index("bf16_exceptions:") - 1]
PATTERN_HINT = (
    "glob uses fnmatch (* ? [seq], close every '['); regex uses Python re syntax (its regular subset: no "
    "backreferences, lookaround or inline flags) and must match the whole name; exact is the whole name"
)


def _error(text: str, *, source: str = "c.yaml") -> ContractError:
    with pytest.raises(ContractError) as info:
        parse_contract(text, source=source)
    return info.value


def test_good_contract_parses() -> None:
    assert parse_contract(GOOD).bf16_exceptions.last_layers == 2


@pytest.mark.parametrize(
    ("case", "edit", "message", "hint"),
    [
        (
            "misspelled field",
            ("    tile: 1x16", "    tyle: 1x16"),
            "c.yaml:6: formats.nvfp4.tyle: unknown field 'tyle'",
            "did you mean 'tile'? valid fields here: tile, weight_scale_scope, per_token_activations, four_over_six, "
            "four_over_six_e4m3_max",
        ),
        (
            "misspelled top-level field",
            ("bf16_exceptions:", "bf16_exception:"),
            "c.yaml:12: bf16_exception: unknown field 'bf16_exception'",
            "did you mean 'bf16_exceptions'? valid fields here: version, name, description, quantizer, "
            "formats, rules, default, bf16_exceptions, fused_groups, backward, kv_cache, "
            "expert_tensor_parallel_size",
        ),
        (
            "quoted number",
            ("  last_layers: 2", "  last_layers: '2'"),
            "c.yaml:13: bf16_exceptions.last_layers: expected a number of layers or "
            "{fraction: ..., rounding: ceil|floor}, found '2'",
            "write a count (e.g. 8) or {fraction: 0.15, rounding: ceil}",
        ),
        (
            "wrong type",
            ("    tile: 1x16", "    per_token_activations: 'yes'"),
            "c.yaml:6: formats.nvfp4.per_token_activations: input should be a valid boolean, found 'yes'",
            "write the value without quotes",
        ),
        (
            "boolean version",
            ("version: 1", "version: true"),
            "c.yaml:1: version: expected 1, found True",
            "add `version: 1` (the only contract format version)",
        ),
        (
            "unknown format",
            ("    format: nvfp4", "    format: nvfp5"),
            "c.yaml:11: rules[0].format: found 'nvfp5', expected 'nvfp4', 'mxfp8' or 'bf16'",
            "did you mean 'nvfp4'? use one of nvfp4, mxfp8, bf16",
        ),
        (
            "unknown matcher kind",
            ("  - kind: glob", "  - kind: globb"),
            "c.yaml:8: rules[0].kind: found 'globb', expected 'glob', 'regex' or 'exact'",
            "did you mean 'glob'? use one of glob, regex, exact",
        ),
        (
            "invalid glob",
            ('    pattern: "*.mlp.experts.*"', '    pattern: "*.mlp.[experts.*"'),
            "c.yaml:10: rules[0].pattern: invalid glob: '[' at position 6 is never closed: '*.mlp.[experts.*'",
            PATTERN_HINT,
        ),
        (
            "invalid regex",
            (
                '  - kind: glob\n    namespace: hf\n    pattern: "*.mlp.experts.*"',
                '  - kind: regex\n    namespace: hf\n    pattern: "(model"',
            ),
            "c.yaml:10: rules[0].pattern: invalid regex: missing ), unterminated subpattern at position 0: '(model'",
            PATTERN_HINT,
        ),
        (
            "empty rule set",
            (
                RULES_BLOCK,
                "rules: []",
            ),
            "c.yaml:7: rules: the rule set is empty",
            RULES_HINT,
        ),
        (
            "missing default",
            ("default: bf16\n", ""),
            "c.yaml:1: default: required field is missing",
            "set `default:` to nvfp4, mxfp8 or bf16, or to null to require a rule for every GEMM weight",
        ),
        (
            "rounding typo",
            ("  last_layers: 2", "  last_layers: {fraction: 0.15, rounding: cel}"),
            "c.yaml:13: bf16_exceptions.last_layers.rounding: found 'cel', expected 'ceil' or 'floor'",
            "did you mean 'ceil'? use one of ceil, floor",
        ),
        (
            "norms cannot be quantized",
            ("  last_layers: 2", "  norms: false"),
            "c.yaml:13: bf16_exceptions.norms: found False, expected True",
            "norm weights are never quantized; leave the field out or write true",
        ),
        (
            "out of range",
            ("  last_layers: 2", "  last_layers: -1"),
            "c.yaml:13: bf16_exceptions.last_layers: input should be greater than or equal to 0, found -1",
            "write a count (e.g. 8) or {fraction: 0.15, rounding: ceil}",
        ),
        (
            "rules not a list",
            (
                RULES_BLOCK,
                "rules: {kind: glob}",
            ),
            "c.yaml:7: rules: input should be a list, found {'kind': 'glob'}",
            RULES_HINT,
        ),
        (
            "duplicate key",
            ("bf16_exceptions:", "default: nvfp4\nbf16_exceptions:"),
            "c.yaml:12: duplicate key 'default' (first on line 3)",
            "each key may appear once per mapping; remove one",
        ),
    ],
    ids=lambda value: value if isinstance(value, str) and " " in value and len(value) < 40 else None,
)
def test_bad_input_is_one_line_naming_file_line_and_field(
    case: str, edit: tuple[str, str], message: str, hint: str
) -> None:
    assert edit[0] in GOOD, case
    error = _error(GOOD.replace(edit[0], edit[1]))
    assert error.message == message
    assert "\n" not in error.message
    assert error.hint == hint
    file_line = re.match(r"c\.yaml:(\d+): ", error.message)
    assert file_line is not None and error.fields["line"] == int(file_line.group(1))
    assert error.fields["file"] == "c.yaml"


def test_error_fields_carry_the_field_path() -> None:
    error = _error(GOOD.replace("    format: nvfp4", "    format: nvfp5"))
    assert error.fields["field"] == "rules[0].format"


def test_several_problems_report_the_first_in_the_file_and_count_the_rest() -> None:
    text = GOOD.replace("version: 1", "version: 2").replace("    format: nvfp4", "    format: fp4")
    assert _error(text).message.startswith("c.yaml:1: version: found 2, expected 1 (+1 more)")


def test_yaml_syntax_error_names_the_line() -> None:
    error = _error(GOOD + "  - [unclosed\n")
    assert error.message == "c.yaml:14: invalid YAML: expected <block end>, but found '-'"
    assert error.fields["line"] == 14


def test_unsafe_yaml_tags_are_refused_not_executed(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    text = GOOD + f"description: !!python/object/apply:os.system ['touch {marker}']\n"
    error = _error(text)
    assert error.message.startswith("c.yaml:14: invalid YAML: could not determine a constructor for the tag")
    assert not marker.exists()


def test_empty_file() -> None:
    error = _error("")
    assert error.message == "c.yaml: (document): the file is empty"


def test_json_contract_loads_like_yaml(tmp_path: Path) -> None:
    import yaml

    path = tmp_path / "contract.json"
    path.write_text(json.dumps(yaml.safe_load(GOOD), indent=1))
    assert load_contract(path) == parse_contract(GOOD)


def test_json_errors_name_the_line(tmp_path: Path) -> None:
    path = tmp_path / "contract.json"
    lines = ['{"version": 1,', '"name": "x",', '"default": "bf16",', '"rules": [', '{"kind": "glob",']
    lines += ['"namespace": "hf",', '"pattern": "*", "format": "bf17"}', "]}"]
    path.write_text("\n".join(lines))
    with pytest.raises(ContractError) as info:
        load_contract(path)
    assert info.value.message == f"{path}:7: rules[0].format: found 'bf17', expected 'nvfp4', 'mxfp8' or 'bf16'"


def test_json_duplicate_keys_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "contract.json"
    path.write_text('{"version": 1,\n "name": "x",\n "name": "y"}')
    with pytest.raises(ContractError) as info:
        load_contract(path)
    assert info.value.message == f"{path}:3: duplicate key 'name' (first on line 2)"


def test_json_syntax_error(tmp_path: Path) -> None:
    path = tmp_path / "contract.json"
    path.write_text('{"version": 1,\n "name": }')
    with pytest.raises(ContractError) as info:
        load_contract(path)
    assert info.value.message == f"{path}:2: invalid JSON: Expecting value"


def test_missing_file_and_wrong_extension(tmp_path: Path) -> None:
    with pytest.raises(ContractError) as info:
        load_contract(tmp_path / "absent.yaml")
    assert info.value.message == f"{tmp_path / 'absent.yaml'}: cannot read the file: No such file or directory"
    other = tmp_path / "contract.toml"
    other.write_text("version = 1")
    with pytest.raises(ContractError) as info:
        load_contract(other)
    assert info.value.message == f"{other}: unsupported file extension '.toml'"
    assert info.value.hint == "write the file as YAML or JSON with one of the extensions .yaml, .yml, .json"
