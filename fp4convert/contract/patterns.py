"""Tensor-name matchers: how a rule's ``pattern`` is checked, compiled, matched and ranked.

Three kinds, each with one meaning:

* ``exact``: the whole name equals the pattern.
* ``glob``: :func:`fnmatch.fnmatchcase` over the whole name, so matching is case-sensitive and
  ``*`` also crosses dots (``*.mlp.experts.*`` matches ``model.layers.3.mlp.experts.7.up_proj.weight``).
  This is the grammar TransformerEngine's precision matchers use (``fnmatch`` on the module path),
  so a Megatron-namespace glob can be emitted to TE verbatim.
* ``regex``: what :func:`re.fullmatch` says, so the pattern must cover the whole name (no implicit
  ``.*``); run by :mod:`fp4convert.contract.linear_regex` in time linear in the name (a contract is
  untrusted: ``(a+)+$`` must not hang), which accepts the regular subset of ``re`` and refuses
  backreferences, lookaround and the like with the reason.

Specificity ranks the rules that match one tensor (see :mod:`fp4convert.contract.resolve`): first
the kind (``exact`` > ``regex`` > ``glob``, the compressed-tensors ``match_targets`` order), then the
number of characters a name must contain literally for the pattern to match. Wildcards, character
classes and regex operators count zero, an escaped character counts one.
"""

from __future__ import annotations

import fnmatch
import re
from functools import lru_cache
from typing import Literal, Protocol

from fp4convert.contract.linear_regex import LinearRegex, UnsupportedRegex

__all__ = ["KIND_RANK", "MatchKind", "check_pattern", "literal_length", "matches"]

MatchKind = Literal["glob", "regex", "exact"]

#: Higher ranks win over lower ones when several rules match a tensor.
KIND_RANK: dict[str, int] = {"exact": 3, "regex": 2, "glob": 1}

_REGEX_OPERATORS = frozenset(".^$*+?{}|()")
_GLOB_WILDCARDS = frozenset("*?")


def check_pattern(kind: MatchKind, pattern: str) -> str | None:
    """Say why ``pattern`` is not a valid matcher of ``kind``, or return None when it is.

    Args:
        kind: ``"glob"``, ``"regex"`` or ``"exact"``.
        pattern: the pattern as written in the contract.

    Returns:
        A one-line reason, or None for a valid pattern.

    Example:
        >>> check_pattern("regex", "model.layers.(3")
        'invalid regex: missing ), unterminated subpattern at position 13'
        >>> check_pattern("glob", "*.mlp.experts.*") is None
        True
    """
    if not pattern:
        return "pattern is empty"
    if pattern != pattern.strip() or any(ch.isspace() for ch in pattern):
        return "pattern contains whitespace; tensor names never do"
    if kind == "regex":
        try:
            re.compile(pattern)
        except re.error as exc:
            return f"invalid regex: {exc}"
        except RecursionError:
            return "invalid regex: nested too deeply"
        try:
            _compiled(kind, pattern)
        except UnsupportedRegex as exc:
            return f"unsupported regex: {exc}"
        except RecursionError:
            return "unsupported regex: nested too deeply"
    elif kind == "glob":
        return _check_glob_brackets(pattern)
    return None


def _class_end(pattern: str, start: int) -> int:
    """Index of the ``]`` closing the character class opened at ``start``, or -1 (fnmatch rules)."""
    j = start + 1
    if pattern[j : j + 1] == "!":
        j += 1
    if pattern[j : j + 1] == "]":  # a "]" right after "[" or "[!" is a literal member
        j += 1
    return pattern.find("]", j)


def _check_glob_brackets(pattern: str) -> str | None:
    # fnmatch silently reads an unclosed "[" as a literal bracket; a contract must not guess.
    i = 0
    while i < len(pattern):
        if pattern[i] == "[":
            close = _class_end(pattern, i)
            if close == -1:
                return f"invalid glob: '[' at position {i} is never closed"
            i = close
        i += 1
    return None


class _Matcher(Protocol):
    def fullmatch(self, text: str, /) -> object: ...


@lru_cache(maxsize=4096)
def _compiled(kind: MatchKind, pattern: str) -> _Matcher:
    if kind == "regex":  # never Python's backtracking engine on a contract's pattern
        return LinearRegex(pattern)
    if kind == "glob":
        return re.compile(fnmatch.translate(pattern))
    return re.compile(re.escape(pattern))


def matches(kind: MatchKind, pattern: str, name: str) -> bool:
    """True if ``name`` matches ``pattern`` as a whole under ``kind``.

    Example:
        >>> matches("glob", "*.mlp.experts.linear_fc1", "decoder.layers.0.mlp.experts.linear_fc1")
        True
        >>> matches("regex", "layers", "model.layers.0.mlp.gate.weight")
        False
    """
    return bool(_compiled(kind, pattern).fullmatch(name))


@lru_cache(maxsize=4096)
def literal_length(kind: MatchKind, pattern: str) -> int:
    """Characters a name must contain literally for ``pattern`` to match: the specificity score.

    Example:
        >>> literal_length("glob", "*.mlp.experts.*")
        13
        >>> literal_length("regex", r".*\\.kv_b_proj\\..*")
        11
    """
    if kind == "exact":
        return len(pattern)
    count = 0
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "[":  # a character class stands for one unknown character
            close = _class_end(pattern, i)
            i = len(pattern) if close == -1 else close + 1
            continue
        if kind == "regex" and ch == "\\":
            escaped = pattern[i + 1 : i + 2]
            count += 0 if escaped.isalnum() else 1  # \d, \w... are classes; \. is a dot
            i += 2
            continue
        wildcard = _REGEX_OPERATORS if kind == "regex" else _GLOB_WILDCARDS
        count += 0 if ch in wildcard else 1
        i += 1
    return count
