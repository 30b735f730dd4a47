"""Run fp4convert commands and interrupt them at chosen points (a helper process of test_interrupts).

``python interrupt_driver.py SPEC.json`` imports fp4convert once, then forks one child per run (the
parent has run no torch operation, so forking is safe), and in each child patches one function so
that the child sends itself a signal there: ``KILL`` (kill -9: nothing runs after it) or ``INT``
(Ctrl-C: Python raises KeyboardInterrupt in the main thread). Points:

* ``read:N``: after the N-th source tensor read (``SourceReader.read``; mid-shard);
* ``record:N``: after the N-th finished shard is journaled (``Journal.record``; between shards);
* ``verify``: every file written, before the output is verified, the journal removed and published;
* ``publish``: verified and the journal removed, before ``DST.partial`` is renamed to ``DST``;
* ``write:N``: after the N-th tensor written by any command (``StreamingWriter.write``).

A run with ``"pause": [ready, go]`` instead stops after its first journaled shard, creates the file
``ready`` and waits for ``go`` to exist (so the test can start a second run on the same DST).
Prints one JSON line: each run's name and how it ended (``signal 9``, ``exit 130``...).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import fp4convert.checkpoint.reader as reader_module
import fp4convert.checkpoint.safetensors_io as io_module
import fp4convert.checkpoint.staging as staging_module
import fp4convert.convert.execute as execute_module
from fp4convert.cli import main


def _after_nth(owner: Any, name: str, n: int, action: Any) -> None:
    original = getattr(owner, name)
    calls = [0]

    def patched(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        calls[0] += 1
        if calls[0] == n:
            action()
        return result

    setattr(owner, name, patched)


def _before(owner: Any, name: str, action: Any) -> None:
    original = getattr(owner, name)

    def patched(*args: Any, **kwargs: Any) -> Any:
        action()
        return original(*args, **kwargs)

    setattr(owner, name, patched)


def _arm(run: dict[str, Any]) -> None:
    if "pause" in run:
        ready, go = (Path(p) for p in run["pause"])

        def wait() -> None:
            ready.touch()
            deadline = time.monotonic() + 120
            while not go.exists() and time.monotonic() < deadline:
                time.sleep(0.02)

        _after_nth(staging_module.Journal, "record", 1, wait)
        return
    sig = {"KILL": signal.SIGKILL, "INT": signal.SIGINT}[run["signal"]]

    def fire() -> None:
        os.kill(os.getpid(), sig)
        time.sleep(0.5)  # SIGINT: let the interpreter raise KeyboardInterrupt here, in the main thread

    point, _, count = run["point"].partition(":")
    if point == "read":
        _after_nth(reader_module.SourceReader, "read", int(count), fire)
    elif point == "record":
        _after_nth(staging_module.Journal, "record", int(count), fire)
    elif point == "write":
        _after_nth(io_module.StreamingWriter, "write", int(count), fire)
    elif point in ("verify", "publish"):
        _before(execute_module, {"verify": "verify_checkpoint", "publish": "publish"}[point], fire)
    else:
        raise SystemExit(f"unknown point {run['point']!r}")


def _child(run: dict[str, Any]) -> None:
    err = os.open(run["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(err, 2)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # the driver's stdout carries only its JSON line
    _arm(run)
    try:
        main(run["argv"])
    except SystemExit as exc:
        os._exit(exc.code if isinstance(exc.code, int) else 1)
    os._exit(0)


def main_driver(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    results = []
    for run in spec["runs"]:
        pid = os.fork()
        if pid == 0:
            _child(run)
        _, status = os.waitpid(pid, 0)
        how = f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else f"exit {os.WEXITSTATUS(status)}"
        results.append({"name": run["name"], "ended": how, "stderr": Path(run["stderr"]).read_text()})
    print(json.dumps(results))


if __name__ == "__main__":
    main_driver(sys.argv[1])
