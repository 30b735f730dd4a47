"""The CLI run in-process by the family-source tests: exit status and everything it printed."""

from __future__ import annotations

import pytest

from fp4convert.cli import main


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        main(argv)
    captured = capsys.readouterr()
    return int(exited.value.code or 0), captured.out + captured.err
