"""A linear-time matcher for contract ``regex`` rules: the regular subset of Python ``re``, no backtracking.

Python's ``re`` backtracks, so a rule such as ``(a+)+$`` or ``(.*)*x`` takes time exponential in the
length of a tensor name; a contract is untrusted input and must not hang the converter. Rules are
matched whole (``re.fullmatch``), and whether a pattern matches a whole string does not depend on
greedy or lazy quantifiers or on the order of alternatives, so the regular subset of ``re`` can be
run as an automaton instead: the pattern becomes a Thompson NFA, simulated as a DFA built lazily
(one transition per state and character, computed once and cached), in time linear in the name and
independent of how the pattern nests.

The subset is RE2's: literals and escapes, ``.``, character classes, ``\\d \\w \\s`` and their
negations, groups (``(...)``, ``(?:...)``, ``(?P<name>...)``), alternation, the quantifiers
``* + ? {m} {m,} {m,n}`` (lazy or not), and the anchors ``^ $ \\A \\Z``. Refused, with the reason:
backreferences, lookaround, atomic groups and possessive quantifiers, conditionals, inline flags,
``\\b``/``\\B``, and counted repeats that would make the automaton larger than :data:`MAX_STATES`.
Single characters are tested with Python's own ``re`` on the atom's source text (one character
cannot backtrack), so a class such as ``[^\\W\\d_]`` means exactly what it means to ``re``.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field

__all__ = ["MAX_PATTERN", "MAX_STATES", "LinearRegex", "UnsupportedRegex", "compile_linear"]

#: the longest pattern accepted (characters)
MAX_PATTERN = 2000
#: the most NFA states a pattern may compile to (counted repeats are expanded)
MAX_STATES = 20000
# DFA states cached per pattern; past it a match simulates the NFA directly (bounds memory).
_MAX_DFA_STATES = 4096


class UnsupportedRegex(ValueError):
    """A valid Python regex outside the linear-time subset: the message says which construct."""


# Node kinds of the parsed pattern.
@dataclass
class _Atom:
    source: str  # the Python re source of one character's test


@dataclass
class _Assert:
    kind: str  # "start" (^, \A), "end" (\Z), "dollar" ($)


@dataclass
class _Concat:
    items: list[object] = field(default_factory=list)


@dataclass
class _Alt:
    options: list[object]


@dataclass
class _Repeat:
    item: object
    low: int
    high: int | None  # None: unbounded


_CLASS_ESCAPES = frozenset("dDwWsS")
_SIMPLE_ESCAPES = frozenset("afnrtv")


class _Parser:
    """Recursive descent over the subset; the pattern already compiled with ``re``."""

    def __init__(self, pattern: str) -> None:
        self.p = pattern
        self.i = 0

    def fail(self, what: str) -> UnsupportedRegex:
        return UnsupportedRegex(
            f"{what} at position {self.i} is not supported (contract regexes are matched in linear time)"
        )

    def parse(self) -> object:
        node = self.alternation()
        if self.i != len(self.p):  # pragma: no cover - re.compile refused unbalanced ')' already
            raise self.fail("unbalanced ')'")
        return node

    def alternation(self) -> object:
        options = [self.concat()]
        while self.i < len(self.p) and self.p[self.i] == "|":
            self.i += 1
            options.append(self.concat())
        return options[0] if len(options) == 1 else _Alt(options)

    def concat(self) -> object:
        node = _Concat()
        while self.i < len(self.p) and self.p[self.i] not in "|)":
            node.items.append(self.quantified())
        return node

    def quantified(self) -> object:
        atom = self.atom()
        bounds = self.quantifier()
        if bounds is None:
            return atom
        if self.i < len(self.p) and self.p[self.i] == "+":
            raise self.fail("a possessive quantifier")
        if self.i < len(self.p) and self.p[self.i] == "?":
            self.i += 1  # lazy: the same strings match a whole name
        return _Repeat(atom, *bounds)

    def quantifier(self) -> tuple[int, int | None] | None:
        if self.i >= len(self.p):
            return None
        ch = self.p[self.i]
        if ch in "*+?":
            self.i += 1
            return {"*": (0, None), "+": (1, None), "?": (0, 1)}[ch]
        if ch == "{":
            match = re.compile(r"\{(\d*)(?:(,)(\d*))?\}").match(self.p, self.i)
            if match is None or (not match.group(1) and not match.group(2)):
                return None  # re reads a '{' that starts no repeat as a literal
            self.i = match.end()
            low = int(match.group(1) or 0)
            if match.group(2) is None:
                return low, low
            return low, int(match.group(3)) if match.group(3) else None
        return None

    def atom(self) -> object:
        ch = self.p[self.i]
        if ch == "(":
            return self.group()
        if ch == "[":
            return _Atom(self.char_class())
        if ch == ".":
            self.i += 1
            return _Atom(".")
        if ch == "^":
            self.i += 1
            return _Assert("start")
        if ch == "$":
            self.i += 1
            return _Assert("dollar")
        if ch == "\\":
            return self.escape()
        if ch == "{":  # a literal brace (it starts no repeat: quantifier() said so)
            self.i += 1
            return _Atom(re.escape(ch))
        self.i += 1
        return _Atom(re.escape(ch))

    def group(self) -> object:
        start = self.i
        self.i += 1
        if self.p.startswith("?:", self.i):
            self.i += 2
        elif self.p.startswith("?P<", self.i):
            self.i = self.p.index(">", self.i) + 1
        elif self.p.startswith("?", self.i):
            self.i = start
            construct = {
                "(?=": "a lookahead",
                "(?!": "a negative lookahead",
                "(?<=": "a lookbehind",
                "(?<!": "a negative lookbehind",
                "(?>": "an atomic group",
                "(?P=": "a backreference",
                "(?(": "a conditional group",
                "(?#": "a comment group",
            }
            what = next((v for k, v in construct.items() if self.p.startswith(k, start)), "an inline flag")
            raise self.fail(what)
        node = self.alternation()
        self.i += 1  # the ')'
        return node

    def char_class(self) -> str:
        start = self.i
        j = self.i + 1
        if self.p[j : j + 1] == "^":
            j += 1
        if self.p[j : j + 1] == "]":
            j += 1
        while self.p[j] != "]":
            j += 2 if self.p[j] == "\\" else 1
        self.i = j + 1
        return self.p[start : self.i]

    def escape(self) -> object:
        start = self.i
        nxt = self.p[self.i + 1]
        self.i += 2
        if nxt in _CLASS_ESCAPES or nxt in _SIMPLE_ESCAPES or not (nxt.isascii() and nxt.isalnum()):
            return _Atom(self.p[start : self.i])
        if nxt == "A":
            return _Assert("start")
        if nxt == "Z":
            return _Assert("end")
        if nxt in "bB":
            self.i = start
            raise self.fail(f"a word boundary (\\{nxt})")
        if nxt == "x":
            self.i += 2
        elif nxt == "u":
            self.i += 4
        elif nxt == "U":
            self.i += 8
        elif nxt == "N":
            self.i = self.p.index("}", self.i) + 1
        elif nxt == "0":
            while self.i < len(self.p) and self.i < start + 4 and self.p[self.i] in "01234567":
                self.i += 1
        else:  # \1 .. \99 (and three-digit octal, refused with them)
            self.i = start
            raise self.fail(f"a backreference (\\{nxt})")
        return _Atom(self.p[start : self.i])


# NFA: state -> ("char", test, next) | ("split", [targets]) | ("assert", kind, next) | ("match",)
_State = tuple[object, ...]


class _Builder:
    def __init__(self) -> None:
        self.states: list[list[object]] = []
        self.tests: dict[str, re.Pattern[str]] = {}

    def new(self, *spec: object) -> int:
        if len(self.states) >= MAX_STATES:
            raise UnsupportedRegex(f"the pattern compiles to more than {MAX_STATES} states (lower its repeat counts)")
        self.states.append(list(spec))
        return len(self.states) - 1

    def build(self, node: object, out: int) -> int:
        """Add the states of ``node`` leading to ``out``; return its entry state."""
        if isinstance(node, _Atom):
            test = self.tests.setdefault(node.source, re.compile(node.source))
            return self.new("char", test, out)
        if isinstance(node, _Assert):
            return self.new("assert", node.kind, out)
        if isinstance(node, _Concat):
            for item in reversed(node.items):
                out = self.build(item, out)
            return out
        if isinstance(node, _Alt):
            return self.new("split", [self.build(option, out) for option in node.options])
        assert isinstance(node, _Repeat)
        if node.high is None:  # item{low,}: low copies, then a loop
            loop = self.new("split", [])
            loop_spec = self.states[loop]
            loop_spec[1] = [self.build(node.item, loop), out]
            entry = loop
            for _ in range(node.low):
                entry = self.build(node.item, entry)
            return entry
        entry = out
        for _ in range(node.high - node.low):  # optional copies, innermost last
            entry = self.new("split", [self.build(node.item, entry), out])
        for _ in range(node.low):
            entry = self.build(node.item, entry)
        return entry


class LinearRegex:
    """A compiled pattern whose :meth:`fullmatch` runs in time linear in the text.

    Example:
        >>> LinearRegex(r"model\\.layers\\.\\d+\\.mlp\\.experts\\..*").fullmatch("model.layers.3.mlp.experts.7.w")
        True
        >>> LinearRegex("(a+)+$").fullmatch("a" * 5000 + "b")
        False
    """

    def __init__(self, pattern: str) -> None:
        if len(pattern) > MAX_PATTERN:
            raise UnsupportedRegex(f"the pattern is {len(pattern)} characters long (at most {MAX_PATTERN})")
        re.compile(pattern)  # the caller checked it is valid Python; this keeps the parser honest
        self.pattern = pattern
        builder = _Builder()
        match = builder.new("match")
        self._start = builder.build(_Parser(pattern).parse(), match)
        self._states = builder.states
        self._match = match
        self._has_asserts = any(s[0] == "assert" for s in builder.states)
        self._lock = threading.Lock()
        self._ids: dict[frozenset[int], int] = {}
        self._sets: list[frozenset[int]] = []
        self._accepting: list[bool] = []
        self._trans: list[dict[object, int]] = []
        self._initial: int | None = None

    def _closure(self, seeds: list[int], flags: int) -> frozenset[int]:
        """NFA states reachable by epsilon moves; ``flags`` says which assertions hold here
        (1: at the start, 2: at the end, 4: before a final newline)."""
        seen: set[int] = set()
        stack = list(seeds)
        while stack:
            s = stack.pop()
            if s in seen:
                continue
            seen.add(s)
            spec = self._states[s]
            if spec[0] == "split":
                stack.extend(spec[1])  # type: ignore[arg-type]
            elif spec[0] == "assert":
                kind = spec[1]
                holds = (
                    (kind == "start" and flags & 1)
                    or (kind == "end" and flags & 2)
                    or (kind == "dollar" and flags & 6)
                )
                if holds:
                    stack.append(spec[2])  # type: ignore[arg-type]
        return frozenset(s for s in seen if self._states[s][0] in ("char", "match"))

    def _move(self, nfa: frozenset[int], ch: str, flags: int) -> frozenset[int]:
        """The NFA states after reading ``ch`` from ``nfa`` (and their closure)."""
        targets = [
            spec[2]
            for s in nfa
            if (spec := self._states[s])[0] == "char" and spec[1].fullmatch(ch)  # type: ignore[attr-defined]
        ]
        return self._closure(targets, flags)  # type: ignore[arg-type]

    def _state(self, nfa: frozenset[int]) -> int:
        """The DFA state of an NFA state set, added to the cache (raises _Full when it is full)."""
        found = self._ids.get(nfa)
        if found is None:
            if len(self._sets) >= _MAX_DFA_STATES:
                raise _Full
            found = self._ids[nfa] = len(self._sets)
            self._sets.append(nfa)
            self._accepting.append(self._match in nfa)
            self._trans.append({})
        return found

    def fullmatch(self, text: str) -> bool:
        """Whether the whole of ``text`` matches (what ``re.fullmatch(pattern, text)`` says)."""
        try:
            return self._run(text)
        except _Full:  # more DFA states than the cache holds: simulate the NFA, still linear
            return self._simulate(text)

    def _flags(self, text: str, pos: int) -> int:
        if not self._has_asserts:
            return 0
        n = len(text)
        return (pos == 0) | ((pos == n) << 1) | ((pos == n - 1 and text.endswith("\n")) << 2)

    def _run(self, text: str) -> bool:
        trans = self._trans
        if not self._has_asserts:  # the usual case: one cached transition per character
            state = self._initial
            if state is None:
                with self._lock:
                    state = self._initial = self._state(self._closure([self._start], 0))
            for ch in text:
                nxt = trans[state].get(ch)
                if nxt is None:
                    nxt = self._cached_step(state, ch, ch, 0)
                state = nxt
            return self._accepting[state]
        with self._lock:
            state = self._state(self._closure([self._start], self._flags(text, 0)))
        for pos, ch in enumerate(text):
            flags = self._flags(text, pos + 1)
            key = (ch, flags)
            nxt = trans[state].get(key)
            if nxt is None:
                nxt = self._cached_step(state, key, ch, flags)
            state = nxt
        return self._accepting[state]

    def _cached_step(self, state: int, key: object, ch: str, flags: int) -> int:
        with self._lock:  # misses build the cache; hits only read it (entries are never removed)
            nxt = self._state(self._move(self._sets[state], ch, flags))
            self._trans[state][key] = nxt
            return nxt

    def _simulate(self, text: str) -> bool:
        current = self._closure([self._start], self._flags(text, 0))
        for pos, ch in enumerate(text):
            current = self._move(current, ch, self._flags(text, pos + 1))
            if not current:
                return False
        return self._match in current


class _Full(Exception):
    """The DFA cache of a pattern is full."""


def compile_linear(pattern: str) -> LinearRegex:
    """:class:`LinearRegex` of ``pattern`` (raises :class:`UnsupportedRegex` outside the subset)."""
    return LinearRegex(pattern)
