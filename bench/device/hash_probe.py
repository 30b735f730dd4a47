"""sha256 of one source file on the host, several ways (issue 13: the per-file hash chain as a floor).

Prints GB/s for: hashlib with 16 MiB preads (`update_from_file` before this stop), hashlib with one reused
buffer (readinto), the same in a child process while this process runs N busy threads, and the
`sha256sum` / `openssl` binaries; then the child `FileHashes` runs (1 MiB reads) against one hashing
the mapped file (its way before stop 34), alone and one per FILE at once.
Usage: python bench/device/hash_probe.py [--children | --chunks] FILE [FILE ...]  (--children: those
rows only; --chunks: the child at 256 KiB to 16 MiB reads against the mapped file, one and all at once)
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


# the FileHashes child before stop 34: sha256 of the mapped file's page-cache pages, in 16 MiB steps
_MAPPED_CHILD = """
import hashlib, mmap, os, sys
sha, step = hashlib.sha256(), 16 << 20
with open(sys.argv[1], "rb") as f:
    size = os.fstat(f.fileno()).st_size
    with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        mapped.madvise(mmap.MADV_SEQUENTIAL)
        view = memoryview(mapped)
        for start in range(0, size, step):
            sha.update(view[start : start + step])
        view.release()
print(sha.hexdigest())
"""


def _mapped(path: str) -> list[str]:
    return [sys.executable, "-I", "-c", _MAPPED_CHILD, path]


def _fresh(names: list[str]) -> dict[str, str]:
    from fp4convert.checkpoint.file_hashes import FileHashes

    with FileHashes("/", [os.path.abspath(f).lstrip("/") for f in names]) as hashes:
        return hashes.hexdigests()


def _all_mapped(files: list[str]) -> None:
    procs = [subprocess.Popen(_mapped(f), stdout=subprocess.PIPE) for f in files]
    for p in procs:
        p.communicate()


def children(files: list[str]) -> None:
    """The FileHashes child against the mapped-file child: one file alone, then every file at once."""
    path, total = files[0], sum(os.path.getsize(f) for f in files)
    size, ref = os.path.getsize(path), file_sha256(path)
    for _ in range(2):
        assert timed("child, mapped file (before stop 34)", size, lambda: run_digest(_mapped(path))) == ref
        assert timed("child, FileHashes (1 MiB reads)", size, lambda: _fresh([path])) == {path.lstrip("/"): ref}
        timed(f"{len(files)} mapped-file children at once (sum of bytes)", total, lambda: _all_mapped(files))
        timed(f"{len(files)} FileHashes children at once (sum of bytes)", total, lambda: _fresh(files))


def _reads_child(path: str, chunk: int) -> list[str]:
    """The FileHashes child's own script, reading ``chunk`` bytes at a time."""
    from fp4convert.checkpoint.file_hashes import _CHILD as child

    return [sys.executable, "-I", "-c", child, path, str(os.getpid()), str(chunk)]


def chunk_sweep(files: list[str]) -> None:
    """The FileHashes child at several read sizes against the mapped file: one file, then all at once."""
    path, total = files[0], sum(os.path.getsize(f) for f in files)
    size, ref = os.path.getsize(path), file_sha256(path)
    ways = {
        f"reads of {c >> 10} KiB": (lambda f, c=c: _reads_child(f, c)) for c in (256 << 10, 1 << 20, 4 << 20, 16 << 20)
    }
    ways["mapped file"] = _mapped
    for _ in range(2):
        for name, argv in ways.items():
            assert timed(f"child, {name}", size, lambda a=argv: run_digest(a(path))) == ref

            def together(a=argv) -> None:
                procs = [subprocess.Popen(a(f), stdout=subprocess.PIPE) for f in files]
                for proc in procs:
                    proc.communicate()

            timed(f"{len(files)} children at once, {name} (sum of bytes)", total, together)


def main() -> None:
    if "--chunks" in sys.argv:
        chunk_sweep([a for a in sys.argv[1:] if a != "--chunks"])
        return
    files = [a for a in sys.argv[1:] if a != "--children"]
    path = files[0]
    size = os.path.getsize(path)
    child = [sys.executable, "-I", "-c", _CHILD, path]
    reused(path, 64 << 20)  # page cache warm
    if "--children" in sys.argv:
        children(files)
        return
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
    children(files)


def _ranged(path: str, size: int) -> str:
    h = hashlib.sha256()
    update_from_file(h, path, 0, size)
    return h.hexdigest()


if __name__ == "__main__":
    main()
