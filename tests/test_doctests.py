"""Every docstring example in fp4convert/ runs, and passes, or says why it cannot run here.

One test per module that has examples. Examples run from the repository root (they name files such
as ``contracts/nvfp4-experts-per-token.yaml``) with ``ELLIPSIS``. An example that cannot run in the
suite (it needs the Hub, a GPU, or a converted checkpoint) carries ``# doctest: +SKIP``, and its
docstring says why in a line ``Example (not run: <reason>):``, which a test here checks.
"""

from __future__ import annotations

import doctest
import importlib
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "fp4convert"
#: Modules that cannot be imported on every machine the suite runs on, and why. Their examples
#: still must exist only where they can run: a test below checks they have none.
NOT_IMPORTABLE_EVERYWHERE = {
    "fp4convert.formats._triton": "needs triton (CUDA machines only)",
    "fp4convert.formats._triton_segments": "needs triton (CUDA machines only)",
}
#: Modules whose skipped examples do not say why yet, owned elsewhere; kept exact by a test so the
#: list only shrinks. (Each entry: add ``Example (not run: <reason>):`` to the docstring, then drop it.)
SKIPS_WITHOUT_A_REASON_YET: set[str] = set()
_REASON = re.compile(r"Example \(not run: [^)]+\):")
_FINDER = doctest.DocTestFinder(exclude_empty=True)


def _module_names() -> list[str]:
    names = []
    for file in sorted(PACKAGE.rglob("*.py")):
        parts = file.relative_to(REPO).with_suffix("").parts
        if parts[-1] == "__main__":
            continue  # running it is running the CLI
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


MODULES = _module_names()
IMPORTABLE = [m for m in MODULES if m not in NOT_IMPORTABLE_EVERYWHERE]


def _tests(name: str) -> list[doctest.DocTest]:
    module = importlib.import_module(name)
    # Only the module's own objects: a name imported from elsewhere is tested where it is defined.
    return [t for t in _FINDER.find(module, name) if t.examples]


def _skipped(test: doctest.DocTest) -> bool:
    return any(example.options.get(doctest.SKIP) for example in test.examples)


@pytest.mark.parametrize("name", [m for m in IMPORTABLE if _tests(m)])
def test_examples_pass(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    failures: list[str] = []
    for test in _tests(name):
        runner.run(test, out=failures.append)
    assert not failures, "".join(failures)


def test_every_skipped_example_says_why() -> None:
    without = {
        name for name in IMPORTABLE for t in _tests(name) if _skipped(t) and not _REASON.search(t.docstring or "")
    }
    assert not without - SKIPS_WITHOUT_A_REASON_YET, (
        f"skipped examples that do not say why (add 'Example (not run: <reason>):'): {sorted(without)}"
    )
    assert not SKIPS_WITHOUT_A_REASON_YET - without, (
        f"these modules say why now: drop them from SKIPS_WITHOUT_A_REASON_YET: "
        f"{sorted(SKIPS_WITHOUT_A_REASON_YET - without)}"
    )


def test_modules_not_importable_everywhere_have_no_examples() -> None:
    for name, why in NOT_IMPORTABLE_EVERYWHERE.items():
        source = (REPO / Path(*name.split("."))).with_suffix(".py").read_text()
        assert ">>>" not in source, f"{name} has examples the suite cannot run ({why}): move them to a module it can"


def test_the_examples_are_many() -> None:
    """A guard against the runner silently finding nothing (a broken finder passes every module)."""
    examples = sum(len(t.examples) for name in IMPORTABLE for t in _tests(name))
    assert examples > 150
