"""Positional shard writes: any order, several threads, the bytes of the sequential writer."""

from __future__ import annotations

import itertools
import os
import random
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from fp4convert.checkpoint.hashing import tensor_sha256
from fp4convert.checkpoint.positional_writer import PositionalWriter
from fp4convert.checkpoint.safetensors_io import StreamingWriter, dtype_name
from fp4convert.errors import CheckpointError


def tensors(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = {}
    for i in range(12):
        shape = (int(torch.randint(1, 40, (1,), generator=g)), int(torch.randint(1, 40, (1,), generator=g)))
        dtype = [torch.bfloat16, torch.float32, torch.uint8, torch.float8_e4m3fn][i % 4]
        out[f"t{i}.weight"] = (torch.randn(shape, generator=g) * 3).to(dtype)
    out["scalar"] = torch.tensor(0.5)
    return out


@pytest.mark.parametrize("seed", range(4))
def test_any_order_from_threads_gives_the_sequential_writers_bytes(tmp_path, seed):
    data = tensors(seed)
    layout = [(name, dtype_name(t.dtype), tuple(t.shape)) for name, t in data.items()]
    meta = {"format": "pt"}
    sequential = StreamingWriter(tmp_path / "a.safetensors", layout, meta)
    for name, t in data.items():
        sequential.write(name, t)
    sequential.close()
    positional = PositionalWriter(tmp_path / "b.safetensors", layout, meta)
    order = list(data)
    random.Random(seed).shuffle(order)
    with ThreadPoolExecutor(4) as pool:
        digests = dict(zip(order, pool.map(lambda n: positional.write(n, data[n]), order), strict=True))
    positional.close()
    assert (tmp_path / "a.safetensors").read_bytes() == (tmp_path / "b.safetensors").read_bytes()
    assert digests == positional.sha256 == sequential.sha256 == {n: tensor_sha256(t) for n, t in data.items()}
    assert positional.nbytes == sequential.nbytes == (tmp_path / "b.safetensors").stat().st_size


@pytest.mark.parametrize("short", [False, True])
def test_runs_of_adjacent_tensors_in_one_call_give_the_same_bytes(tmp_path, monkeypatch, short):
    # write_many: neighbours in the file go out in one pwritev; a short pwritev (the kernel may
    # write less than asked) is finished buffer by buffer. Non-contiguous inputs are copied first.
    data = tensors(7)
    data["t1.weight"] = data["t1.weight"].t()  # a transposed view: not contiguous
    layout = [(name, dtype_name(t.dtype), tuple(t.shape)) for name, t in data.items()]
    sequential = StreamingWriter(tmp_path / "a.safetensors", layout)
    for name, t in data.items():
        sequential.write(name, t)
    sequential.close()
    if short:
        real = os.pwritev
        monkeypatch.setattr(os, "pwritev", lambda fd, views, offset: real(fd, [bytes(views[0])[:3]], offset))
    positional = PositionalWriter(tmp_path / "b.safetensors", layout)
    names = list(data)
    groups = [names[0:3], names[5:9], names[3:5], names[9:]]  # runs, out of file order
    digests = [d for group in groups for d in positional.write_many([(n, data[n]) for n in group])]
    positional.close()
    assert (tmp_path / "a.safetensors").read_bytes() == (tmp_path / "b.safetensors").read_bytes()
    assert digests == [sequential.sha256[n] for group in groups for n in group]
    assert positional.sha256 == sequential.sha256


def test_refusals_name_the_tensor_and_abort_removes_the_file(tmp_path):
    path = tmp_path / "c.safetensors"
    w = PositionalWriter(path, [("a", "F32", (2,)), ("b", "U8", (3,))])
    with pytest.raises(CheckpointError, match=r"wrote 'x', which the layout does not declare"):
        w.write("x", torch.ones(2))
    with pytest.raises(CheckpointError, match=r"tensor 'a' is BF16 \(2,\), declared F32 \(2,\)"):
        w.write("a", torch.ones(2, dtype=torch.bfloat16))
    w.write("a", torch.ones(2))
    with pytest.raises(CheckpointError, match=r"tensor 'a' written twice"):
        w.write("a", torch.ones(2))
    with pytest.raises(CheckpointError, match=r"1 declared tensors were not written \(first: 'b'\)"):
        w.close()
    w.abort()
    assert not path.exists()
    with pytest.raises(CheckpointError, match=r"tensor 'a' declared twice"):
        PositionalWriter(path, [("a", "F32", (2,)), ("a", "F32", (2,))])


def test_a_symlink_left_at_the_name_is_replaced_not_followed(tmp_path):
    target = tmp_path / "elsewhere"
    target.write_bytes(b"keep me")
    (tmp_path / "d.safetensors").symlink_to(target)
    w = PositionalWriter(tmp_path / "d.safetensors", [("a", "U8", (1,))])
    w.write("a", torch.ones(1, dtype=torch.uint8))
    w.close()
    assert target.read_bytes() == b"keep me" and not (tmp_path / "d.safetensors").is_symlink()


def test_writebacks_fall_due_every_so_many_bytes_and_change_no_byte(tmp_path):
    data = tensors(7)
    layout = [(n, dtype_name(t.dtype), tuple(t.shape)) for n, t in data.items()]
    seq = StreamingWriter(tmp_path / "seq.safetensors", layout)
    for name, t in data.items():
        seq.write(name, t)
    seq.close()
    every = 2000
    writer = PositionalWriter(tmp_path / "pos.safetensors", layout, writeback_every=every)
    since, due = 0, []
    for name, t in reversed(data.items()):
        writer.write(name, t)
        since += t.numel() * t.element_size()
        due.append(writer.writeback_due())
        assert due[-1] == (since >= every)  # due once `every` bytes were written since the last time
        if due[-1]:
            since = 0
            writer.writeback()  # the caller's background fdatasync, here inline
    assert any(due) and not all(due)
    writer.close()
    writer.writeback()  # after close: nothing (no fd left to sync)
    assert (tmp_path / "pos.safetensors").read_bytes() == (tmp_path / "seq.safetensors").read_bytes()
    never = PositionalWriter(tmp_path / "never.safetensors", layout)  # writeback_every=0: never due
    for name, t in data.items():
        never.write(name, t)
        assert not never.writeback_due()
    never.abort()


@pytest.mark.parametrize("fault", ["flipped byte", "short read"])
def test_a_write_that_reads_back_different_is_an_error_naming_the_tensor(tmp_path, monkeypatch, fault):
    # Every write is read back and compared with the bytes hashed: a disk or file system that
    # returns other bytes (or fewer) fails the write of that tensor, not a later verify.
    data = tensors(3)
    layout = [(name, dtype_name(t.dtype), tuple(t.shape)) for name, t in data.items()]
    w = PositionalWriter(tmp_path / "d.safetensors", layout)
    w.write("t0.weight", data["t0.weight"])  # read back intact
    real = os.preadv

    def lying(fd, buffers, offset):
        n = real(fd, buffers, offset)
        if fault == "short read":
            return n - 1
        buffers[0][n // 2] ^= 0x01
        return n

    monkeypatch.setattr(os, "preadv", lying)
    with pytest.raises(CheckpointError, match=r"'t5\.weight' reads back different") as info:
        w.write("t5.weight", data["t5.weight"])
    assert info.value.tensor == "t5.weight"
    w.abort()
    assert not (tmp_path / "d.safetensors").exists()


def test_a_tensor_larger_than_the_read_back_buffer_is_compared_in_pieces(tmp_path, monkeypatch):
    # the read-back buffer is reused in pieces; a change in the last piece is still found
    monkeypatch.setattr("fp4convert.checkpoint.positional_writer._SCRATCH_BYTES", 1000)
    monkeypatch.setattr("fp4convert.checkpoint.positional_writer._per_thread", __import__("threading").local())
    big = torch.arange(3001, dtype=torch.uint8)
    w = PositionalWriter(tmp_path / "e.safetensors", [("big", "U8", (3001,))])
    real = os.preadv
    offsets = []

    def last_piece_flipped(fd, buffers, offset):
        n = real(fd, buffers, offset)
        offsets.append(offset)
        if len(offsets) == 4:  # three full pieces, then the fourth: the last byte
            buffers[0][n - 1] ^= 0x80
        return n

    monkeypatch.setattr(os, "preadv", last_piece_flipped)
    with pytest.raises(CheckpointError, match="'big' reads back different"):
        w.write("big", big)
    w.abort()
    assert [b - a for a, b in itertools.pairwise(offsets)] == [1000, 1000, 1000]
