"""GraphReplay's rule (eager the first time a key is seen, captured the second, replayed while it
holds; a failed capture turns replays off), with the CUDA capture replaced by a recorder: the
state machine runs on the CPU. The real capture and its bytes are tests/megatron/test_validate.py's
GPU tests."""

from __future__ import annotations

import pytest
import torch

from fp4convert.formats.uploads import upload
from fp4convert.megatron.replay import GraphReplay


def _sync(replay: GraphReplay[str], owner: object, key: list[int], work) -> str:
    """One call the way the validator and the exporter make it."""
    if replay.holds(owner, key):
        return replay.replay(owner, key)
    if replay.seen(owner, key):
        out = replay.capture(owner, key, torch.device("cuda"), work)
        return work() if out is None else out
    replay.saw(owner, key)
    return work()


def test_eager_then_captured_then_replayed_while_the_key_holds(captures):
    replay: GraphReplay[str] = GraphReplay()
    runs: list[int] = []
    owner = object()

    def work() -> str:
        runs.append(1)
        return f"out{len(runs)}"

    assert _sync(replay, owner, [1, 2], work) == "out1"  # first sight: eager, nothing captured
    assert not replay.captured and not replay.holds(owner, [1, 2]) and replay.seen(owner, [1, 2])
    assert _sync(replay, owner, [1, 2], work) == "out2"  # second: captured (work ran once while recording)
    assert replay.graphs == 1 and len(captures.made) == 1 and captures.made[0].replays == 1
    assert replay.holds(owner, [1, 2]) and not replay.holds(owner, [1, 3]) and not replay.holds(object(), [1, 2])
    for _ in range(3):  # then replays hand back the captured outputs, work is not run
        assert _sync(replay, owner, [1, 2], work) == "out2"
    assert len(runs) == 2 and captures.made[0].replays == 4
    # another key (an exporter's second set of buffers): eager, then captured, the first kept beside it
    assert _sync(replay, owner, [1, 3], work) == "out3" and not replay.holds(owner, [1, 3])
    assert _sync(replay, owner, [1, 3], work) == "out4" and replay.holds(owner, [1, 3])
    assert _sync(replay, owner, [1, 2], work) == "out2" and captures.made[0].replays == 5  # alternating
    # a third key (another owner, even with an equal key) pushes out the least recently used
    assert _sync(replay, object(), [1, 3], work) == "out5"
    assert replay.holds(owner, [1, 2]) and not replay.holds(owner, [1, 3]) and replay.graphs == 1
    assert len(captures.made) == 2 and len(runs) == 5


def test_a_failed_capture_runs_the_work_eagerly_from_then_on(captures):
    replay: GraphReplay[str] = GraphReplay()
    calls: list[int] = []
    owner = object()

    def work() -> str:
        calls.append(1)
        return str(len(calls))

    captures.fail = RuntimeError("operation not permitted when stream is capturing")
    assert [_sync(replay, owner, [7], work) for _ in range(4)] == ["1", "2", "3", "4"]
    assert not replay.captured and isinstance(replay.failed, RuntimeError) and not replay.seen(owner, [7])
    assert captures.made == []


def test_uploads_are_refused_while_a_graph_is_captured(monkeypatch):
    # a recorded copy would be replayed from a freed staging buffer: the capture must fail instead
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(RuntimeError, match="CUDA graph is being captured"):
        upload([torch.arange(3)], "cuda")
    assert upload([torch.arange(3)], "cpu")[0].tolist() == [0, 1, 2]  # the CPU never captures
