"""A local cluster of ranks for tests: N spawned processes in one gloo process group.

The test process hosts the rendezvous store, as ``torchrun``'s agent does (the ranks join with
``TORCHELASTIC_USE_AGENT_STORE=True``), so any rank may be killed and the others still reach it.
The ranks are started once and then take jobs: each job is one library call made by every rank
at once (``convert_checkpoint`` or ``verify_checkpoint`` with the same arguments); each rank sends
back its result or its error as plain data. A job may kill one rank midway (SIGKILL from its own
progress hook), which leaves the cluster unusable: start a new one.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import queue
import signal
import socket
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch.distributed as dist

from fp4convert.checkpoint.source import open_checkpoint
from fp4convert.contract import load_contract
from fp4convert.convert.distributed import share_shards
from fp4convert.convert.group_amax import groups_to_agree
from fp4convert.dialects import get_dialect
from fp4convert.plan import plan_conversion

#: a contract quantizing every decoder Linear, so q/k/v, gate/up and MLA q_a/kv_a groups are fused
ALL_LINEAR = """version: 1
name: nvfp4-all-decoder-linears
description: NVFP4 on every decoder Linear (attention and experts).
formats: {nvfp4: {per_token_activations: true}}
rules: [{kind: glob, namespace: hf, pattern: "model.layers.*", format: nvfp4}]
default: bf16
bf16_exceptions: {routers: true, lm_head: true}
"""


def cross_rank_groups(source: Path, contract: Path, dialect: str, max_shard_size: int | None, world: int) -> int:
    """Fused groups whose members ``world`` ranks write on more than one rank (their shared scale is
    agreed across ranks): a test asserts there are some, so its equal bytes prove the agreement."""
    c = load_contract(contract)
    plan = plan_conversion(open_checkpoint(source), c, get_dialect(dialect), max_shard_size=max_shard_size)
    files = list(plan.by_output_file())
    agreed = groups_to_agree(plan, share_shards(plan, files, world), files)
    return sum(len(set(readers.values())) > 1 for readers in agreed.values())


def assert_same_output(one: Path, other: Path, *, also_differs: tuple[str, ...] = ()) -> None:
    """Every file of two outputs byte-identical; the manifests identical but for their creation
    time (and the manifest keys ``also_differs``: ``device`` between a CPU and a GPU run)."""
    names = sorted(p.name for p in one.iterdir())
    assert names == sorted(p.name for p in other.iterdir())
    for name in names:
        if name == "fp4convert.json":
            a, b = (json.loads((d / name).read_text()) for d in (one, other))
            for key in ("created", *also_differs):
                a.pop(key), b.pop(key)
            assert json.dumps(a) == json.dumps(b)  # the same keys in the same order: the same bytes
        else:
            assert (one / name).read_bytes() == (other / name).read_bytes(), name


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _progress_hook(job: dict[str, Any], rank: int, counted: dict[str, int]) -> Any:
    """The progress hook the job gives this rank: one that kills it (``die``), makes it fail
    (``fail``) or counts its bytes into ``counted`` (``count_progress``); None for none of them."""
    die, fail = job.get("die"), job.get("fail")
    if die is not None and die["rank"] == rank:
        seen: list[str] = []

        def hook(event: str, payload: Any, after: int = die["after_tensors"]) -> None:
            if event == "tensor":
                seen.append(payload["name"])
                if len(seen) == after:
                    os.kill(os.getpid(), signal.SIGKILL)

        return hook
    if fail is not None and fail["rank"] == rank:
        done: list[str] = []

        def failing(event: str, payload: Any, after: int = fail["after_tensors"]) -> None:
            if event == "tensor":
                done.append(payload["name"])
                if len(done) == after:
                    raise RuntimeError("injected failure")

        return failing
    if job.get("count_progress"):

        def count(event: str, payload: Any) -> None:
            if "bytes" in payload:
                counted[event] = counted.get(event, 0) + payload["bytes"]
            if event == "plan":
                counted["total"] = payload["bytes"]

        return count
    return None


def _serve(rank: int, world: int, port: int, jobs: Any, results: Any) -> None:
    os.environ.update(
        {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(world),
            "TORCHELASTIC_USE_AGENT_STORE": "True",
            "TORCHELASTIC_RESTART_COUNT": "0",
        }
    )
    import torch

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=60))
    from fp4convert.convert.execute import convert_checkpoint
    from fp4convert.verify.distributed import verify_distributed

    calls = {"convert": convert_checkpoint, "verify": verify_distributed}
    while True:
        job = jobs.get()
        if job is None:
            break
        kwargs = {**job["kwargs"], **job["per_rank"].get(rank, {})}
        counted: dict[str, int] = {}
        hook = _progress_hook(job, rank, counted)
        if hook is not None:
            kwargs["progress"] = hook
        try:
            out = calls[job["call"]](*job["args"], **kwargs)
            data = out.to_json() if hasattr(out, "to_json") else dataclasses.asdict(out)
            results.put((rank, {"ok": True, "result": data, "progress": counted}))
        except Exception as exc:  # sent back as data: the test asserts on it
            fields = {k: v for k, v in getattr(exc, "fields", {}).items() if isinstance(v, str | int | type(None))}
            results.put((rank, {"ok": False, "type": type(exc).__name__, "message": str(exc), "fields": fields}))
    dist.destroy_process_group()


class Cluster:
    """``world`` local ranks in one gloo group; :meth:`run` hands them one job."""

    def __init__(self, world: int) -> None:
        self.world = world
        port = _free_port()
        self._store = dist.TCPStore("127.0.0.1", port, world, is_master=True, wait_for_workers=False)
        context = multiprocessing.get_context("spawn")
        self._jobs = [context.Queue() for _ in range(world)]
        self._results = context.Queue()
        self.processes = [
            context.Process(target=_serve, args=(r, world, port, self._jobs[r], self._results), daemon=True)
            for r in range(world)
        ]
        for p in self.processes:
            p.start()

    def run(
        self,
        call: str,
        *args: Any,
        die: dict[str, int] | None = None,
        fail: dict[str, int] | None = None,
        per_rank: dict[int, dict[str, Any]] | None = None,
        count_progress: bool = False,
        timeout: float = 240,
        **kwargs: Any,
    ) -> dict[int, dict[str, Any]]:
        """Every rank's outcome of ``call(*args, **kwargs)``.

        ``die={"rank": r, "after_tensors": n}`` kills rank r (SIGKILL) after n tensors (its outcome
        is ``{"killed": True}``); ``fail=`` makes it raise ``RuntimeError("injected failure")``
        instead; ``per_rank={r: {...}}`` gives rank r other keyword arguments; ``count_progress``
        adds each rank's progress bytes per event to its outcome (``"progress"``).
        """
        job = {"call": call, "args": args, "kwargs": kwargs, "die": die, "fail": fail, "per_rank": per_rank or {}}
        for q in self._jobs:
            q.put({**job, "count_progress": count_progress})
        out: dict[int, dict[str, Any]] = {}
        expected = set(range(self.world)) - ({die["rank"]} if die else set())
        deadline = time.monotonic() + timeout
        while set(out) != expected:
            try:
                rank, result = self._results.get(timeout=0.5)
            except queue.Empty:
                dead = [r for r in sorted(expected - set(out)) if not self.processes[r].is_alive()]
                if dead or time.monotonic() > deadline:
                    why = f"died (exit codes {[self.processes[r].exitcode for r in dead]})" if dead else "timed out"
                    missing = dead or sorted(expected - set(out))
                    raise AssertionError(f"ranks {missing} gave no result: {why}") from None
                continue
            out[rank] = result
        if die:
            self.processes[die["rank"]].join(timeout=30)
            out[die["rank"]] = {"killed": self.processes[die["rank"]].exitcode == -signal.SIGKILL}
        return out

    def close(self) -> None:
        for q, p in zip(self._jobs, self.processes, strict=True):
            if p.is_alive():
                q.put(None)
        for p in self.processes:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
