"""The hostile-input corpus: how a case is set up, run through the real CLI, and judged.

A *case* is one bad input, built from the session's tiny checkpoints by a small edit (a truncated
shard, a lying header, a crafted index, a config.json that disagrees, a NaN, a hostile contract,
a tampered output ...). A *command* is how one fp4convert command is pointed at that kind of input.
The corpus is the table of (command, case) pairs (:mod:`hostile.table`): adding a command is one
entry in a command table plus the cases where it legitimately succeeds.

Every pair runs ``fp4convert.cli.main`` in this process (no interpreter start per case) and is
judged by :func:`judge`: the command's exit status and output are what the expectation says, no
traceback ever, the whole workspace (source, a victim folder hostile names aim at, the good
output, the contract) hashes the same before and after except ``DST`` and ``DST.partial``, and no
``DST`` and no manifest in ``DST.partial`` ("no complete-looking output").
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import re
import shutil
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

INDEX = "model.safetensors.index.json"
MANIFEST = "fp4convert.json"
#: the error line every refusal starts with; ``internal`` (a bug) never counts
ERROR_LINE = re.compile(r"^error\[(?P<code>[a-z]+)\]: \S")
#: the most stderr lines a refusal may take (a listed refusal: headline, a few problems, hint)
MAX_ERROR_LINES = 14


@dataclass
class Workspace:
    """One case's folder: ``src`` (the source, edited by source cases), ``out`` (a good converted
    output, edited by output cases), ``victim`` (what crafted names aim at), ``contract``, and the
    destination path ``dst`` (absent)."""

    root: Path
    src: Path
    out: Path
    victim: Path
    contract: Path
    dst: Path
    writable: set[str] = field(default_factory=set)  # paths (relative to root) a command may write

    @property
    def staging(self) -> Path:
        return self.dst.with_name(self.dst.name + ".partial")

    def tree(self) -> dict[str, str]:
        """sha256 of every file and the target of every symlink under ``root``, except ``DST``,
        ``DST.partial`` and the declared writable paths."""
        skip = {self.dst.name, self.staging.name, *self.writable}
        found: dict[str, str] = {}
        for path in sorted(self.root.rglob("*")):
            rel = path.relative_to(self.root)
            if rel.parts[0] in skip or str(rel) in skip:
                continue
            if path.is_symlink():
                found[str(rel)] = "-> " + str(path.readlink())
            elif path.is_file():
                found[str(rel)] = hashlib.sha256(path.read_bytes()).hexdigest()
            else:
                found[str(rel)] = "dir"
        return found


@dataclass
class Outcome:
    """What one command did."""

    code: int | None
    stdout: str
    stderr: str
    escaped: BaseException | None = None  # an exception that got past main(): a traceback

    def text(self) -> str:
        return f"exit {self.code}\n--- stdout\n{self.stdout}\n--- stderr\n{self.stderr}"


def run_cli(argv: list[str]) -> Outcome:
    """``fp4convert ARGV`` in this process: exit status, stdout, stderr."""
    from fp4convert.cli import main

    out, err = io.StringIO(), io.StringIO()
    escaped: BaseException | None = None
    code: int | None = None
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main([str(a) for a in argv])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException as exc:  # judged below: nothing may get past main()
            escaped = exc
    return Outcome(code, out.getvalue(), err.getvalue(), escaped)


@dataclass(frozen=True)
class Expect:
    """What a command must do on a case.

    ``kind``: ``"error"`` (exit 1, one ``error[code]: ...`` on stderr matching ``pattern``),
    ``"fails"`` (a report command: exit 1 and ``pattern`` in its report, nothing on stderr),
    ``"usage"`` (click refuses the argument itself: exit 2, ``Error: ...`` naming it) or ``"ok"``
    (a stated decision: the command does not read what the case broke; exit 0).
    """

    kind: str
    pattern: str = ""
    why: str = ""  # for "ok": the decision, in words
    status: int = 1  # the exit status of "error" and "fails" (``doctor``: 2 for a folder it cannot read)


ERROR = "error"
FAILS = "fails"
USAGE = "usage"
OK = "ok"


def judge(outcome: Outcome, ws: Workspace, before: dict[str, str], expect: Expect) -> None:
    """Assert the corpus guarantees for one (command, case) run."""
    shown = outcome.text()
    assert outcome.escaped is None, f"an exception got past main(): {outcome.escaped!r}\n{shown}"
    assert "Traceback" not in outcome.stderr + outcome.stdout, shown
    assert ws.tree() == before, f"something outside DST changed\n{shown}"
    if expect.kind == OK:
        assert outcome.code == 0, shown
        return
    assert not ws.dst.exists(), f"a refused run left {ws.dst}\n{shown}"
    assert not (ws.staging / MANIFEST).exists(), f"a refused run left a complete-looking {ws.staging}\n{shown}"
    if expect.kind == USAGE:
        assert outcome.code == 2 and re.search(r"^Error: Invalid value for", outcome.stderr, re.M), shown
        assert re.search(expect.pattern, outcome.stderr, re.S), f"usage error lacks {expect.pattern!r}\n{shown}"
        return
    assert outcome.code == expect.status, shown
    if expect.kind == FAILS:
        assert re.search(expect.pattern, outcome.stdout, re.S), f"report lacks {expect.pattern!r}\n{shown}"
        assert "error[" not in outcome.stderr, shown
        return
    assert_error(outcome, expect.pattern, status=expect.status)


def assert_error(outcome: Outcome, pattern: str, *, status: int = 1) -> None:
    """One short fp4convert error (never ``internal``) matching ``pattern``, exit status ``status``."""
    shown = outcome.text()
    assert outcome.escaped is None and "Traceback" not in outcome.stderr, shown
    assert outcome.code == status, shown
    lines = outcome.stderr.rstrip("\n").splitlines()
    first = ERROR_LINE.match(lines[0]) if lines else None
    assert first is not None and first["code"] != "internal", f"not one fp4convert error\n{shown}"
    assert len(lines) <= MAX_ERROR_LINES, f"the error is not short ({len(lines)} lines)\n{shown}"
    assert re.search(pattern, outcome.stderr, re.S), f"error lacks {pattern!r}\n{shown}"
    assert outcome.stdout == "", shown


# --- editing tiny checkpoints -------------------------------------------------------------------


def shard_of(src: Path, tensor: str) -> Path:
    """The file holding ``tensor`` (through the index when there is one)."""
    if (src / INDEX).is_file():
        return src / json.loads((src / INDEX).read_text())["weight_map"][tensor]
    return src / "model.safetensors"


def raw_header(path: Path) -> tuple[dict[str, Any], bytes]:
    """(header object, data bytes) of a safetensors file."""
    blob = path.read_bytes()
    (n,) = struct.unpack("<Q", blob[:8])
    return json.loads(blob[8 : 8 + n]), blob[8 + n :]


def write_raw(path: Path, header: Any, data: bytes, *, length: int | None = None) -> None:
    """A safetensors file from a header (object, or raw bytes) and data; ``length`` lies about its size."""
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw) if length is None else length) + raw + data)


def edit_header(path: Path, edit: Callable[[dict[str, Any]], Any]) -> None:
    header, data = raw_header(path)
    result = edit(header)
    write_raw(path, header if result is None else result, data)


def edit_tensors(src: Path, tensor: str, edit: Callable[[dict[str, torch.Tensor]], None]) -> None:
    """Load the shard holding ``tensor``, let ``edit`` change its tensors, save it, fix the index."""
    path = shard_of(src, tensor)
    tensors = load_file(str(path))
    edit(tensors)
    save_file(tensors, str(path), metadata={"format": "pt"})
    if (src / INDEX).is_file():
        index = json.loads((src / INDEX).read_text())
        index["weight_map"] = {t: f for t, f in index["weight_map"].items() if f != path.name or t in tensors}
        index["weight_map"].update(dict.fromkeys(tensors, path.name))
        (src / INDEX).write_text(json.dumps(index))


def edit_json(path: Path, edit: Callable[[Any], object]) -> None:
    """Let ``edit`` change the JSON file's data in place (what it returns is ignored)."""
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def copy_tree(source: Path, target: Path) -> None:
    shutil.copytree(source, target, symlinks=True)


def assert_same_output(dst: Path, ref: Path) -> None:
    """Every file of two outputs byte-identical, the manifest equal but for its creation time."""
    files = sorted(p.name for p in dst.iterdir())
    assert files == sorted(p.name for p in ref.iterdir())
    for name in files:
        if name == MANIFEST:
            a, b = (json.loads((d / name).read_text()) for d in (dst, ref))
            a.pop("created"), b.pop("created")
            assert a == b
        else:
            assert (dst / name).read_bytes() == (ref / name).read_bytes(), name
