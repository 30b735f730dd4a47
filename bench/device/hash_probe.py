"""sha256 of one source file on the host, several ways (issue 13: the per-file hash chain as a floor).

Prints GB/s for: hashlib with 16 MiB preads (`update_from_file` before this stop), hashlib with one reused
buffer (readinto), the same in a child process while this process runs N busy threads, and the
`sha256sum` / `openssl` binaries. Usage: python bench/device/hash_probe.py FILE [FILE ...]
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import threading
import time

from fp4convert.checkpoint.hashing import file_sha256, update_from_file


def timed(label: str, nbytes: int, fn) -> str:
    t = time.perf_counter()
    out = fn()
    dt = time.perf_counter() - t
    print(f"{label:48s} {nbytes / dt / 1e9:6.2f} GB/s  ({dt:.2f} s)", flush=True)
    return out


def reused(path: str, chunk: int) -> str:
    h = hashlib.sha256()
    buf = bytearray(chunk)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


_CHILD = (
    "import hashlib, sys\n"
    "h, b = hashlib.sha256(), bytearray(64 << 20)\n"
    "v = memoryview(b)\n"
    "f = open(sys.argv[1], 'rb', buffering=0)\n"
    "while n := f.readinto(b):\n"
    "    h.update(v[:n])\n"
    "print(h.hexdigest())\n"
)


def run_digest(command: list[str]) -> str:
    return subprocess.run(command, capture_output=True, check=True).stdout.split()[0].decode()


def main() -> None:
    files = sys.argv[1:]
    path = files[0]
    size = os.path.getsize(path)
    child = [sys.executable, "-I", "-c", _CHILD, path]
    reused(path, 64 << 20)  # page cache warm
    ref = timed("hashlib, 16 MiB preads (update_from_file)", size, lambda: _ranged(path, size))
    for mib in (1, 16, 64):
        assert timed(f"hashlib, reused {mib} MiB buffer", size, lambda m=mib: reused(path, m << 20)) == ref
    assert timed("hashlib, 4 MiB reads (file_sha256)", size, lambda: file_sha256(path)) == ref
    for tool in (["sha256sum"], ["openssl", "dgst", "-sha256", "-r"]):
        try:
            assert timed(" ".join(tool), size, lambda t=tool: run_digest([*t, path])) == ref
        except (FileNotFoundError, subprocess.CalledProcessError) as exc:
            print(tool[0], "unavailable:", exc)
    assert timed("child python, 64 MiB buffer", size, lambda: run_digest(child)) == ref
    total = sum(os.path.getsize(f) for f in files)

    def all_children() -> None:
        procs = [subprocess.Popen([*child[:-1], f], stdout=subprocess.PIPE) for f in files]
        for p in procs:
            p.communicate()

    timed(f"{len(files)} child processes at once (sum of bytes)", total, all_children)
    for busy in (8, 15):
        stop = threading.Event()

        def spin(stop: threading.Event = stop) -> None:  # Python work holding the GIL between short releases
            while not stop.is_set():
                sum(range(2000))
                time.sleep(0)

        threads = [threading.Thread(target=spin) for _ in range(busy)]
        for t in threads:
            t.start()
        try:
            timed(f"in-process reused 64 MiB, {busy} busy threads", size, lambda: reused(path, 64 << 20))
            timed(f"in-process 16 MiB preads, {busy} busy threads", size, lambda: _ranged(path, size))
            timed(f"child python, {busy} busy threads here", size, lambda: run_digest(child))
        finally:
            stop.set()
            for t in threads:
                t.join()


def _ranged(path: str, size: int) -> str:
    h = hashlib.sha256()
    update_from_file(h, path, 0, size)
    return h.hexdigest()


if __name__ == "__main__":
    main()
