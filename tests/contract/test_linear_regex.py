"""The linear-time matcher of contract regexes: the same verdict as ``re.fullmatch`` on every pattern
of its subset, the constructs outside it refused by name, and patterns that make Python's ``re``
backtrack exponentially answered at once."""

from __future__ import annotations

import re
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fp4convert.contract import parse_contract
from fp4convert.contract.linear_regex import MAX_STATES, LinearRegex, UnsupportedRegex
from fp4convert.contract.patterns import check_pattern, matches
from fp4convert.errors import ContractError

_ATOMS = ["a", "b", ".", r"\.", r"\d", r"\w", "[ab]", "[^a]", "[a-c.]", r"[\d_]", "x", "_", r"\s", "[]a]", "{"]


@st.composite
def _pattern(draw: st.DrawFn, depth: int = 0) -> str:
    """A random pattern of the subset: atoms, groups, alternation, every quantifier, anchors."""
    parts = []
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["atom"] * 4 + (["group", "alt"] if depth < 3 else [])))
        if kind == "atom":
            part = draw(st.sampled_from(_ATOMS))
        elif kind == "group":
            opener = draw(st.sampled_from(["(", "(?:", f"(?P<g{draw(st.integers(0, 9))}>"]))
            part = f"{opener}{draw(_pattern(depth + 1))})"
            if "(?P<" in opener and opener in "".join(parts):
                part = f"(?:{draw(_pattern(depth + 1))})"
        else:
            part = f"(?:{draw(_pattern(depth + 1))}|{draw(_pattern(depth + 1))})"
        if part != "{":
            part += draw(st.sampled_from(["", "", "*", "+", "?", "*?", "+?", "??", "{2}", "{0,2}", "{1,}", "{,2}"]))
        parts.append(part)
    anchors = draw(st.sampled_from([("", ""), ("^", ""), ("", "$"), (r"\A", r"\Z"), ("^", "$")]))
    return anchors[0] + "".join(parts) + anchors[1]


@settings(max_examples=200, deadline=None, derandomize=True)
@given(pattern=_pattern(), texts=st.lists(st.text(alphabet="ab.x_1 \n", max_size=8), min_size=1, max_size=6))
def test_the_same_verdict_as_re_fullmatch(pattern, texts):
    try:
        compiled = re.compile(pattern)
    except re.error:
        return  # not a valid pattern at all (e.g. a name given twice): check_pattern says so
    linear = LinearRegex(pattern)
    for text in texts:
        assert linear.fullmatch(text) == (compiled.fullmatch(text) is not None), (pattern, text)


@pytest.mark.parametrize(
    ("pattern", "construct"),
    [
        (r"(a)\1", r"a backreference \(\\1\)"),
        (r"(?P<x>a)(?P=x)", "a backreference"),
        ("(?=a)a", "a lookahead"),
        ("(?!a)b", "a negative lookahead"),
        ("(?<=a)b", "a lookbehind"),
        ("(?<!a)b", "a negative lookbehind"),
        ("(?>a)", "an atomic group"),
        ("a*+", "a possessive quantifier"),
        ("(?i)a", "an inline flag"),
        ("(a)?(?(1)b|c)", "a conditional group"),
        (r"\bword", r"a word boundary \(\\b\)"),
        ("(?#note)a", "a comment group"),
    ],
)
def test_constructs_outside_the_subset_are_refused_by_name(pattern, construct):
    with pytest.raises(UnsupportedRegex, match=construct):
        LinearRegex(pattern)
    assert re.search(construct, check_pattern("regex", pattern) or "")


def test_a_repeat_too_large_for_an_automaton_is_refused():
    with pytest.raises(UnsupportedRegex, match=rf"more than {MAX_STATES} states"):
        LinearRegex("(a{1000}){1000}")


@pytest.mark.parametrize(
    ("pattern", "name", "verdict"),
    [
        ("(a+)+$", "a" * 5000 + "b", False),
        ("(.*)*x", "model.layers.0.mlp.experts.0.gate_proj.weight" * 20, False),
        ("(a|aa)*c", "a" * 5000, False),
        ("(.*a){12}", "a" * 3000, True),
        (r"(\w+\.)*weight_scale", "model.layers.3.mlp.experts.7.up_proj." * 30 + "weight", False),
        (r"(\w+\.)*weight", "model.layers.3.mlp.experts.7.up_proj." * 30 + "weight", True),
        ("(x+x+)+y", "x" * 5000, False),
    ],
)
def test_patterns_that_make_re_backtrack_are_answered_at_once(pattern, name, verdict):
    started = time.perf_counter()
    assert matches("regex", pattern, name) is verdict
    assert time.perf_counter() - started < 2.0  # Python's re takes hours on the longer of these
    assert (re.fullmatch(pattern, name[:12]) is not None) == LinearRegex(pattern).fullmatch(name[:12])


def test_a_contract_with_a_catastrophic_regex_resolves_in_bounded_time():
    text = (
        "version: 1\nname: bomb\ndefault: bf16\nrules:\n"
        "  - {kind: regex, namespace: hf, pattern: '(.*)*\\.experts\\.(\\d+)*\\.(gate|up|down)_proj\\.weight', "
        "format: nvfp4}\n"
    )
    contract = parse_contract(text)
    from fp4convert.model_source import load_model_inventory

    inventory = load_model_inventory("Qwen3-30B-A3B")  # 18867 tensors, 18432 of them routed experts
    started = time.perf_counter()
    decisions = contract.decide_all(inventory)
    assert time.perf_counter() - started < 30
    assert sum(d.format == "nvfp4" for d in decisions.values()) == 18432


def test_a_refused_regex_names_rule_and_construct_in_the_contract_error():
    text = (
        "version: 1\nname: x\ndefault: bf16\nrules:\n"
        "  - {kind: regex, namespace: hf, pattern: '(?=a).*', format: bf16}\n"
    )
    with pytest.raises(ContractError, match=r"<contract>:5: rules\[0\]\.pattern: unsupported regex: a lookahead"):
        parse_contract(text)
