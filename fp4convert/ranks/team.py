"""The ranks of one run: who is who, and how they exchange results without hanging on a dead one.

A :class:`Team` is what the converter and the verifier see. A process on its own is a team of one
(:class:`Team` itself: every exchange returns at once). Under an initialized ``torch.distributed``
process group, :class:`RankTeam` connects to the group's rendezvous store (the ``MASTER_ADDR`` /
``MASTER_PORT`` that ``torchrun`` and ``env://`` use) and exchanges JSON there, never pickle:

* every rank beats (a counter in the store, every ``beat`` seconds) from a thread of its own, for
  the team's whole life, and every wait checks the beats of the ranks it waits on: a rank whose
  beat stops for ``rank_timeout`` seconds (killed, or its node gone) is reported by rank, and
  nobody waits forever, however long the others' work takes;
* a rank that fails posts its error before it raises; every other rank raises
  :class:`~fp4convert.errors.DistributedError` naming that rank and its error at its next wait,
  or within a beat while it works (the work polls :meth:`Team.check`);
* :meth:`Team.agree` refuses ranks started with different arguments, naming the field and ranks.

The one collective on the process group itself is :meth:`Team.max_reduce` (NCCL for GPU ranks,
gloo for CPU ranks), entered only after a store exchange proved every rank alive and there.
"""

from __future__ import annotations

import itertools
import json
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from datetime import timedelta
from typing import Any

import torch

from fp4convert.errors import DistributedError

__all__ = ["RankTeam", "Team", "current_team"]

#: progress callback (event, payload), as the converter's
Hook = Callable[[str, Mapping[str, Any]], None]

_SESSIONS = itertools.count()  # one key namespace per team: every rank makes its teams in the same order


class Team:
    """A team of one process: rank 0 of 1; exchanges return at once."""

    rank = 0
    world = 1
    local_rank = 0
    local_world = 1
    _on_message: Callable[[int, Any], None] | None = None

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    def device(self, device: str) -> str:
        """The device this rank computes on for the ``device`` asked for (``cuda``: its ``LOCAL_RANK`` GPU)."""
        return device

    def agree(self, what: str, fields: Mapping[str, Any]) -> None:
        """Refuse to go on unless every rank was given the same ``fields`` (see :class:`RankTeam`)."""

    def exchange(self, tag: str, payload: Any) -> list[Any]:
        """Every rank's ``payload`` (JSON data), in rank order, on every rank."""
        return [payload]

    def gather(self, tag: str, payload: Any) -> list[Any] | None:
        """Every rank's ``payload`` on rank 0 (None elsewhere)."""
        return [payload]

    def broadcast(self, tag: str, payload: Any) -> Any:
        """Rank 0's ``payload`` on every rank (the others pass anything)."""
        return payload

    def max_reduce(self, values: torch.Tensor) -> torch.Tensor:
        """The elementwise maximum of every rank's float32 ``values`` (exact: max never rounds)."""
        return values

    @contextmanager
    def working(
        self, hook: Hook | None = None, on_message: Callable[[int, Any], None] | None = None
    ) -> Iterator[None]:
        """While the work runs: peers watched (:meth:`check` raises once one failed); on rank 0,
        ``hook("bytes", {"bytes": n, "rank": r})`` for the bytes the other ranks report done, and
        ``on_message(rank, payload)`` for every :meth:`send` of any rank (all delivered by the end)."""
        self._on_message = on_message
        try:
            yield
        finally:
            self._on_message = None

    def send(self, payload: Any) -> None:
        """Deliver ``payload`` (JSON data) to rank 0's ``on_message`` while :meth:`working`."""
        if self._on_message is not None:
            self._on_message(self.rank, payload)

    def check(self) -> None:
        """Raise :class:`~fp4convert.errors.DistributedError` if another rank failed or was lost."""

    def progress(self, nbytes: int) -> None:
        """Report ``nbytes`` more done by this rank (rank 0's display adds them up)."""

    def fail(self, exc: BaseException) -> None:
        """Tell the other ranks this rank failed with ``exc`` (call it before raising)."""

    def close(self) -> None:
        """Stop beating; nothing more is exchanged."""


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if isinstance(exc, DistributedError) else f"{type(exc).__name__}: {text}"


class RankTeam(Team):
    """The ranks of an initialized ``torch.distributed`` process group (see the module docstring).

    Args:
        store: a client of the group's rendezvous store.
        rank, world, local_rank, local_world: this process's place in the group.
        rank_timeout: seconds without a beat after which a rank is reported lost.
        beat: seconds between beats.
    """

    def __init__(
        self,
        store: Any,
        *,
        rank: int,
        world: int,
        local_rank: int = 0,
        local_world: int = 1,
        rank_timeout: float = 60.0,
        beat: float = 0.5,
    ) -> None:
        import torch.distributed as dist

        restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        self._store = dist.PrefixStore(f"fp4convert/{restart}/{next(_SESSIONS)}", store)
        self.rank, self.world = rank, world
        self.local_rank, self.local_world = local_rank, local_world
        self.rank_timeout = rank_timeout
        self._beat_every = beat
        self._lock = threading.Lock()  # one store call at a time from this process
        self._beats: dict[int, tuple[bytes | None, float]] = {r: (None, time.monotonic()) for r in range(world)}
        self._stop = threading.Event()
        self._abort: DistributedError | None = None
        self._done_bytes = 0
        self._watch: Hook | None = None
        self._watching = False
        self._failed_posted = False
        self._beat_count = 0
        self._reductions = 0
        self._delivered: dict[int, int] = {}
        self._reported: dict[int, int] = {}  # rank 0: the bytes of each rank already shown
        self._deliver_lock = threading.Lock()
        self._set(f"beat/{rank}", b"0")
        self._thread = threading.Thread(target=self._run, name="fp4convert-rank-beat", daemon=True)
        self._thread.start()

    # -- the store, one call at a time ------------------------------------------------------------

    def _call(self, method: str, *args: Any) -> Any:
        try:
            with self._lock:
                return getattr(self._store, method)(*args)
        except (RuntimeError, OSError) as exc:  # the store's host (rank 0 or the launcher) is gone
            raise DistributedError(
                f"rank {self.rank} lost the rendezvous store ({exc}): rank 0 or the launcher that hosts it stopped",
                hint="see the other ranks' errors; resume the run with the same command and --resume",
                rank=0,
            ) from exc

    def _set(self, key: str, value: bytes) -> None:
        self._call("set", key, value)

    def _has(self, key: str) -> bool:
        return bool(self._call("check", [key]))

    def _get(self, key: str) -> bytes:
        return bytes(self._call("get", key))

    # -- peers: failures and beats ---------------------------------------------------------------

    def _failure(self) -> DistributedError | None:
        """The error of a rank that posted one (a first failure before one that followed it)."""
        if int(self._call("add", "failures", 0)) == 0:
            return None
        posted = []
        for r in range(self.world):
            if r != self.rank and self._has(f"failed/{r}"):
                posted.append((r, json.loads(self._get(f"failed/{r}"))))
        posted.sort(key=lambda p: (p[1].get("secondary", False), p[0]))
        if not posted:
            return None
        r, info = posted[0]
        if info.get("secondary"):
            return DistributedError(info["error"], hint=info.get("hint"), rank=info.get("rank", r))
        return DistributedError(
            f"rank {r} failed: {info['error']}",
            hint="nothing was published; fix the cause on that rank and run the same command again with --resume "
            "(resume=True): finished shards are kept",
            rank=r,
        )

    def _lost(self, ranks: Sequence[int]) -> DistributedError | None:
        now = time.monotonic()
        for r in ranks:
            if r == self.rank:
                continue
            value = self._get(f"beat/{r}") if self._has(f"beat/{r}") else None
            seen, since = self._beats[r]
            if value != seen:
                self._beats[r] = (value, now)
            elif now - since > self.rank_timeout:
                return DistributedError(
                    f"rank {r} stopped responding (no heartbeat for {now - since:.0f} s): it was killed, or its "
                    "node is unreachable",
                    hint="nothing was published; run the same command again with --resume (resume=True): "
                    "finished shards are kept",
                    rank=r,
                )
        return None

    def _peer_problem(self, ranks: Sequence[int]) -> DistributedError | None:
        return self._failure() or self._lost(ranks)

    def _run(self) -> None:
        last_beat = 0.0
        while not self._stop.wait(0.1):
            try:
                now = time.monotonic()
                if now - last_beat >= self._beat_every:
                    self._beat_count += 1
                    self._set(f"beat/{self.rank}", str(self._beat_count).encode())
                    last_beat = now
                if not self._watching:
                    continue
                self._set(f"bytes/{self.rank}", str(self._done_bytes).encode())
                if self._abort is None:
                    self._abort = self._peer_problem(range(self.world))
                self._deliver()
                self._report_bytes()
            except DistributedError as exc:
                self._abort = self._abort or exc
            except Exception as exc:  # a progress hook that raised: stop the work with its error
                self._abort = self._abort or DistributedError(f"progress display failed: {_describe(exc)}")

    def _report_bytes(self) -> None:
        """Hand rank 0's progress hook the bytes the other ranks posted since the last call."""
        with self._deliver_lock:
            if self._watch is None:
                return
            for r in range(1, self.world):
                if self._has(f"bytes/{r}"):
                    done = int(self._get(f"bytes/{r}"))
                    if done > self._reported.get(r, 0):
                        self._watch("bytes", {"bytes": done - self._reported.get(r, 0), "rank": r})
                        self._reported[r] = done

    def _wait(self, keys: Mapping[int, str]) -> dict[int, bytes]:
        """The values of ``keys`` (rank -> key) once every one is posted; raises if a rank failed or is lost."""
        out: dict[int, bytes] = {}
        pause = 0.002
        while True:
            for r, key in keys.items():
                if r not in out and self._has(key):
                    out[r] = self._get(key)
            if len(out) == len(keys):
                return out
            problem = self._peer_problem([r for r in keys if r not in out])
            if problem is not None:
                raise problem
            time.sleep(pause)
            pause = min(pause * 2, 0.1)

    # -- the Team interface -----------------------------------------------------------------------

    def device(self, device: str) -> str:
        if device == "cuda":  # more ranks than GPUs on a node share them
            index = self.local_rank % max(1, torch.cuda.device_count())
            torch.cuda.set_device(index)
            return f"cuda:{index}"
        return device

    def agree(self, what: str, fields: Mapping[str, Any]) -> None:
        every = self.exchange(f"agree/{what}", dict(fields))
        for key in fields:
            values = [json.dumps(f.get(key), sort_keys=True) for f in every]
            if len(set(values)) > 1:
                differ = [r for r, v in enumerate(values) if v != values[0]]
                shown = ", ".join(f"rank {r}: {every[r].get(key)!r}" for r in [0, *differ[:3]])
                raise DistributedError(
                    f"the ranks were started with different {what}: {key} differs ({shown})",
                    hint="start every rank with the same command, source, destination and options",
                    field=key,
                    rank=None,
                )

    def exchange(self, tag: str, payload: Any) -> list[Any]:
        self._set(f"x/{tag}/{self.rank}", json.dumps(payload).encode())
        got = self._wait({r: f"x/{tag}/{r}" for r in range(self.world)})
        return [json.loads(got[r]) for r in range(self.world)]

    def gather(self, tag: str, payload: Any) -> list[Any] | None:
        self._set(f"g/{tag}/{self.rank}", json.dumps(payload).encode())
        if not self.is_root:
            return None
        got = self._wait({r: f"g/{tag}/{r}" for r in range(self.world)})
        return [json.loads(got[r]) for r in range(self.world)]

    def broadcast(self, tag: str, payload: Any) -> Any:
        if self.is_root:
            self._set(f"b/{tag}", json.dumps(payload).encode())
            return payload
        return json.loads(self._wait({0: f"b/{tag}"})[0])

    def max_reduce(self, values: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        self._reductions += 1
        self.exchange(f"reduce/{self._reductions}", True)  # every rank is alive and at this point
        out = values.clone()
        backend = str(dist.get_backend())
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        # NCCL for GPU ranks; gloo when ranks share a GPU (NCCL refuses two ranks on one device)
        if "nccl" in backend and gpus and ("gloo" not in backend or self.local_world <= gpus):
            out = out.to(f"cuda:{self.local_rank % gpus}")
        try:
            dist.all_reduce(out, op=dist.ReduceOp.MAX)
        except RuntimeError as exc:  # a peer died within the collective: name it, as a wait would
            deadline = time.monotonic() + self.rank_timeout + 2 * self._beat_every
            while time.monotonic() < deadline:
                problem = self._peer_problem(range(self.world))
                if problem is not None:
                    raise problem from exc
                time.sleep(0.1)
            raise
        return out.cpu()

    @contextmanager
    def working(
        self, hook: Hook | None = None, on_message: Callable[[int, Any], None] | None = None
    ) -> Iterator[None]:
        self._watch = hook if self.is_root else None
        self._on_message = on_message if self.is_root else None
        self._watching = True
        try:
            yield
        except BaseException:
            self._watching = False
            with suppress(Exception):  # what a lost rank sent before it went (its finished shards) still counts
                self._deliver()
            raise
        else:
            self._watching = False
            self._set(f"bytes/{self.rank}", str(self._done_bytes).encode())
            try:
                self.exchange("messages-sent", True)  # every rank's sends and final bytes have landed
            finally:  # a rank lost after rank 0's own share was done: what it sent still counts
                with suppress(Exception):
                    self._deliver()
            self._report_bytes()
        finally:
            self._watching = False
            self._watch = None
            self._on_message = None

    def send(self, payload: Any) -> None:
        if self.is_root:
            super().send(payload)
            return
        seq = int(self._call("add", f"m/{self.rank}", 1))
        self._set(f"m/{self.rank}/{seq}", json.dumps(payload).encode())

    def _deliver(self) -> None:
        """Hand rank 0's ``on_message`` what the other ranks sent since the last call, in order."""
        with self._deliver_lock:
            if self._on_message is None:
                return
            for r in range(1, self.world):
                sent = int(self._call("add", f"m/{r}", 0))
                while self._delivered.get(r, 0) < sent:
                    key = f"m/{r}/{self._delivered.get(r, 0) + 1}"
                    if not self._has(key):
                        break  # counted, not written yet: next time
                    self._on_message(r, json.loads(self._get(key)))
                    self._delivered[r] = self._delivered.get(r, 0) + 1

    def check(self) -> None:
        if self._abort is not None:
            raise self._abort

    def progress(self, nbytes: int) -> None:
        self._done_bytes += nbytes

    def fail(self, exc: BaseException) -> None:
        if self._failed_posted:
            return
        self._failed_posted = True
        secondary = isinstance(exc, DistributedError)
        info = {"error": _describe(exc), "secondary": secondary}
        if secondary:
            info["hint"] = getattr(exc, "hint", None)
            info["rank"] = getattr(exc, "rank", None)
        try:
            self._set(f"failed/{self.rank}", json.dumps(info).encode())
            self._call("add", "failures", 1)
        except DistributedError:
            pass  # the store is gone: the others find out by themselves

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def current_team(*, rank_timeout: float = 60.0, store: Any = None) -> Team:
    """The team of this process: a :class:`RankTeam` under an initialized process group of two or
    more ranks, else a team of one.

    Args:
        rank_timeout: seconds without a heartbeat before a rank is reported lost.
        store: the rendezvous store to use (default: a client of ``MASTER_ADDR:MASTER_PORT``).

    Raises:
        DistributedError: a process group of several ranks is initialized but no store can be reached.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return Team()
    if store is None:
        host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
        if not host or not port:
            raise DistributedError(
                "a process group is initialized, but MASTER_ADDR / MASTER_PORT do not name its rendezvous store",
                hint="launch with torchrun, or initialize the group with init_method='env://'",
            )
        store = dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=max(rank_timeout, 30)))
    return RankTeam(
        store,
        rank=dist.get_rank(),
        world=dist.get_world_size(),
        local_rank=int(os.environ.get("LOCAL_RANK", "0")),
        local_world=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        rank_timeout=rank_timeout,
    )
