"""Every (command, bad input) pair of the corpus (:mod:`hostile.table`): one clear error (or, for a
report command, a failed report; or a stated decision), never a traceback, the source and
everything outside DST unchanged, no complete-looking output."""

from __future__ import annotations

import pytest
from hostile.corpus import judge, run_cli
from hostile.table import ON_CONTRACT, ON_OUTPUT, ON_SOURCE, pairs

_COMMANDS = {"source": ON_SOURCE, "output": ON_OUTPUT, "contract": ON_CONTRACT}
_PAIRS = list(pairs())


@pytest.mark.parametrize(
    ("kind", "command", "case", "expect"),
    _PAIRS,
    ids=[f"{command}:{case.id}" for _, command, case, _ in _PAIRS],
)
def test_bad_input(kind, command, case, expect, workspace):
    case.edit(workspace)
    argv = _COMMANDS[kind][command](workspace)
    before = workspace.tree()
    judge(run_cli(argv), workspace, before, expect)


def test_the_corpus_covers_every_family_for_every_command():
    families = {kind: {case.family for k, _, case, _ in _PAIRS if k == kind} for kind in _COMMANDS}
    assert families["source"] >= {"truncated", "lying-header", "traversal", "config", "nonfinite"}
    assert families["output"] >= {"stray-file", "traversal", "tampered", "truncated", "missing"}
    assert families["contract"] == {"contract"}
    for kind, commands in _COMMANDS.items():
        for command in commands:
            assert {case.family for k, c, case, _ in _PAIRS if k == kind and c == command} == families[kind]
