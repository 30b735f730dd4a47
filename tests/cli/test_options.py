"""Shared options are declared once (cli/options.py) and results become JSON in one place (cli/render.py)."""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest

from fp4convert.cli import cli, render
from fp4convert.cli.options import parse_size
from fp4convert.errors import ConversionError, HubError

CLI = Path(render.__file__).parent


def _commands(group: click.Group, prefix: str = "") -> dict[str, click.Command]:
    found: dict[str, click.Command] = {}
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            found |= _commands(command, f"{prefix}{name} ")
        else:
            found[f"{prefix}{name}"] = command
    return found


@pytest.mark.parametrize("flag", ["--json", "--device", "--overwrite", "--quiet", "--model"])
def test_a_shared_option_reads_the_same_in_every_command(flag: str) -> None:
    spellings = {}
    for name, command in _commands(cli).items():
        for param in command.params:
            if isinstance(param, click.Option) and flag in param.opts:
                spellings[name] = (param.name, tuple(param.opts), param.help, param.default, param.is_flag)
    assert len(spellings) >= 2, f"{flag} is not shared"
    assert len(set(spellings.values())) == 1, f"{flag} is declared differently: {spellings}"


def test_json_is_declared_and_written_in_one_place() -> None:
    for file in sorted(CLI.glob("*.py")):
        text = file.read_text()
        if file.name != "options.py":
            assert '"--json"' not in text, f"{file.name} declares --json itself: use options.json_output"
        if file.name != "render.py":
            assert "json.dumps" not in text, f"{file.name} serializes JSON itself: use render.echo_json"


def test_json_text_reads_every_result_kind() -> None:
    from dataclasses import dataclass

    @dataclass
    class Plain:
        tensors: int

    class Reported:
        def to_json(self) -> dict[str, bool]:
            return {"ok": True}

    assert json.loads(render.json_text(Plain(3))) == {"tensors": 3}
    assert json.loads(render.json_text(Reported())) == {"ok": True}
    assert json.loads(render.json_text([1, 2])) == [1, 2]


def test_errors_and_findings_read_alike() -> None:
    error = HubError("no repo me/x on huggingface.co", hint="check the repo id")
    assert render.error_text(error) == "error[hub]: no repo me/x on huggingface.co\n  hint: check the repo id"
    assert render.problem_text("warning", "rule-never-matches", "rules[2] matches nothing", None) == (
        "warning[rule-never-matches]: rules[2] matches nothing"
    )


def test_sizes() -> None:
    assert (parse_size("5GB"), parse_size("2GiB"), parse_size("512")) == (5 * 10**9, 2**31, 512)
    with pytest.raises(ConversionError, match=r"^--max-shard-size 'lots' is not a size"):
        parse_size("lots")
