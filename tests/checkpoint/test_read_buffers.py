"""Reused read buffers: a buffer goes out again only once nothing made from it is alive."""

from __future__ import annotations

import ctypes
import resource
import threading

import pytest
import torch

from fp4convert.checkpoint.read_buffers import ReadBuffers


def test_a_free_buffer_is_reused_and_one_in_use_never_is():
    pool = ReadBuffers(1 << 20)
    first = pool.take(4096)
    address = first.data_ptr()
    del first
    again = pool.take(4096)
    assert again.data_ptr() == address  # free: reused
    # anything made from it keeps it taken: a view of another dtype, a numpy array, raw bytes
    for holder in (
        lambda t: t.view(torch.bfloat16).reshape(32, 64),
        lambda t: t.numpy(),
        lambda t: memoryview(t.numpy()),
        lambda t: (ctypes.c_char * 4096).from_buffer(t.numpy()),
    ):
        kept = holder(again)
        del again
        other = pool.take(4096)
        assert other.data_ptr() != address
        del other, kept
        again = pool.take(4096)
        assert again.data_ptr() == address


def test_the_pool_owns_at_most_keep_bytes_and_evicts_free_buffers_for_new_sizes():
    pool = ReadBuffers(3 * 4096)
    held = [pool.take(4096) for _ in range(3)]
    assert pool._owned == 3 * 4096
    extra = pool.take(4096)  # no room: a buffer of its own, not owned
    assert pool._owned == 3 * 4096 and extra.numel() == 4096
    del held[0]
    bigger = pool.take(8192)  # one free 4096 buffer evicted: still no room for 8192, so not owned
    assert pool._owned == 2 * 4096
    del bigger
    held.clear()
    pool.take(8192)
    assert pool._owned <= 3 * 4096


def test_threads_never_share_a_buffer():
    pool = ReadBuffers(64 * 1024)
    errors = []

    def work(mark: int) -> None:
        for _ in range(300):
            t = pool.take(1024)
            t.fill_(mark)
            if not bool((t == mark).all()):  # another thread wrote into this buffer meanwhile
                errors.append(mark)

    threads = [threading.Thread(target=work, args=(m,)) for m in range(1, 9)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_reads_from_keep_below_get_memory_of_their_own():
    pool = ReadBuffers(1 << 20, keep_below=8192)
    large = pool.take(8192)
    assert pool._owned == 0 and large.numel() == 8192  # not the pool's: freed with the tensor
    del large
    small = pool.take(4096)
    assert pool._owned == 4096 and small.numel() == 4096


def test_large_reads_map_whole_huge_pages_and_sizes_that_round_alike_share_a_buffer():
    pool = ReadBuffers(64 << 20)
    three = pool.take(3 << 20)
    assert three.numel() == 3 << 20 and pool._owned == 4 << 20  # mapped: two whole 2 MiB pages
    address = three.data_ptr()
    del three
    again = pool.take((3 << 20) + 12345)  # rounds to the same 4 MiB: the same buffer
    assert again.data_ptr() == address and again.numel() == (3 << 20) + 12345
    assert address % (2 << 20) == 0  # on a huge-page boundary (the kernel aligns 2 MiB multiples)
    small = pool.take(4096)
    assert small.numel() == 4096 and pool._owned == (4 << 20) + 4096  # small reads are not rounded


def _transparent_huge_pages() -> str:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return f.read().split("[")[1].split("]")[0]
    except (OSError, IndexError):
        return "never"


@pytest.mark.skipif(
    _transparent_huge_pages() == "never", reason="the kernel has transparent huge pages off: 4 KiB faults are expected"
)
def test_a_fresh_large_buffer_fills_with_huge_page_faults_not_one_per_4_kib():
    # the regression: an anonymous map was MAP_SHARED (shmem), where MADV_HUGEPAGE does nothing
    # unless the host enables shmem huge pages, so 8 MiB cost 2048 faults
    pool = ReadBuffers(0, keep_below=1)  # every read a fresh buffer
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    buffer = pool.take(8 << 20)
    buffer.fill_(1)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    assert faults < 256, faults
