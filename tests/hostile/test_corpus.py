"""Every (command, bad input) pair of the corpus (:mod:`hostile.table`): one clear error (or, for a
report command, a failed report; or a stated decision), never a traceback, the source and
everything outside DST unchanged, no complete-looking output.

One test per bad input: its workspace is built once and every command of the input's kind meets
it in turn (a refusal writes nothing, so the next command sees the same workspace; what a command
that legitimately succeeds writes into DST is removed before the next one). Every failing command
of a case is reported, not only the first.
"""

from __future__ import annotations

import shutil

import pytest
from hostile.corpus import judge, run_cli
from hostile.table import ON_CONTRACT, ON_OUTPUT, ON_SOURCE, pairs

_COMMANDS = {"source": ON_SOURCE, "output": ON_OUTPUT, "contract": ON_CONTRACT}
_PAIRS = list(pairs())
_CASES = list({(kind, case.id): (kind, case) for kind, _, case, _ in _PAIRS}.values())


@pytest.mark.parametrize(("kind", "case"), _CASES, ids=[f"{kind}:{case.id}" for kind, case in _CASES])
def test_bad_input(kind, case, workspace):
    case.edit(workspace)
    failures = []
    for _, command, _, expect in (p for p in _PAIRS if p[0] == kind and p[2].id == case.id):
        before = workspace.tree()
        outcome = run_cli(_COMMANDS[kind][command](workspace))
        try:
            judge(outcome, workspace, before, expect)
        except AssertionError as exc:
            failures.append(f"--- {command} ({expect.kind}): {exc}")
        for path in (workspace.dst, workspace.staging):  # what an accepted run wrote
            shutil.rmtree(path, ignore_errors=True)
    assert not failures, "\n".join(failures)


def test_the_corpus_covers_every_family_for_every_command():
    families = {kind: {case.family for k, _, case, _ in _PAIRS if k == kind} for kind in _COMMANDS}
    assert families["source"] >= {"truncated", "lying-header", "traversal", "config", "nonfinite", "source-format"}
    assert families["output"] >= {"stray-file", "traversal", "tampered", "truncated", "missing"}
    assert families["contract"] == {"contract"}
    for kind, commands in _COMMANDS.items():
        for command in commands:
            assert {case.family for k, c, case, _ in _PAIRS if k == kind and c == command} == families[kind]


def test_every_decision_names_a_pair_of_the_corpus():
    from hostile.table import DECISIONS

    known = {(command, case.id) for _, command, case, _ in _PAIRS} | {
        (command, case.family) for _, command, case, _ in _PAIRS
    }
    assert set(DECISIONS) <= known, sorted(set(DECISIONS) - known)
    assert all(e.why for e in DECISIONS.values() if e.kind == "ok")  # every success is a stated decision
