"""One conversion of the device batches' source (/tmp/fd/src -> /dev/shm/out), in a process of its own,
printed as one line: seconds, GB/s of source, the phases, and that process's CPU time, page faults
and voluntary context switches.

Usage: python3 bench/device/conv_once.py [--fresh] [convert options]
``--fresh`` removes the previous output first (a conversion into a new folder, the usual case);
otherwise it is replaced with ``--overwrite``.
"""

from __future__ import annotations

import json
import resource
import shutil
import subprocess
import sys
import time

OUT = "/dev/shm/out"
args = sys.argv[1:]
fresh = "--fresh" in args
args = [a for a in args if a != "--fresh"]
if fresh:
    shutil.rmtree(OUT, ignore_errors=True)
cmd = [sys.executable, "-m", "fp4convert", "convert", "/tmp/fd/src", OUT, "--contract",
       "contracts/nvfp4-experts-per-token.yaml", "--max-shard-size", "500MB", "--json", "--quiet",
       *([] if fresh else ["--overwrite"]), *args]  # fmt: skip
before = resource.getrusage(resource.RUSAGE_CHILDREN)
started = time.time()
proc = subprocess.run(cmd, capture_output=True, text=True)
wall = time.time() - started
if "{" not in proc.stdout:
    print(proc.stderr[-3000:])
    sys.exit(0)
r = json.loads(proc.stdout[proc.stdout.index("{") :])
u = resource.getrusage(resource.RUSAGE_CHILDREN)
phases = {k: round(v, 2) for k, v in r["phases"].items()}
print(
    f"{' '.join(args) or 'default':12s} seconds {r['seconds']:.2f} GB/s {r['source_bytes'] / 1e9 / r['seconds']:.2f} "
    f"{phases} wall {wall:.1f} user {u.ru_utime - before.ru_utime:.1f} sys {u.ru_stime - before.ru_stime:.1f} "
    f"minflt {u.ru_minflt - before.ru_minflt} nvcsw {u.ru_nvcsw - before.ru_nvcsw}",
    flush=True,
)
