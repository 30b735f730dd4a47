# Issue 13: workers 12 / 13 / 16 interleaved, three runs each, into a fresh DST every time (a
# conversion's usual case: --overwrite's deletion of the previous output is not in the figure).
W=/tmp/fd; . bench/device/source.sh
conv() { rm -rf /dev/shm/out; python3 - "$@" <<'PY'
import json, resource, subprocess, sys, time
cmd = [sys.executable, "-m", "fp4convert", "convert", "/tmp/fd/src", "/dev/shm/out", "--contract",
       "contracts/nvfp4-experts-per-token.yaml", "--max-shard-size", "500MB", "--json", "--quiet", *sys.argv[1:]]
before = resource.getrusage(resource.RUSAGE_CHILDREN)
t = time.time(); proc = subprocess.run(cmd, capture_output=True, text=True); out = proc.stdout; wall = time.time() - t
if "{" not in out: print(proc.stderr[-3000:]); sys.exit(0)
r = json.loads(out[out.index("{"):]); u = resource.getrusage(resource.RUSAGE_CHILDREN)
print(f"{' '.join(sys.argv[1:]) or 'default':12s} seconds {r['seconds']:.2f} GB/s {r['source_bytes'] / 1e9 / r['seconds']:.2f} {({k: round(v, 2) for k, v in r['phases'].items()})} "
      f"user {u.ru_utime - before.ru_utime:.1f} sys {u.ru_stime - before.ru_stime:.1f}")
PY
}
for i in 1 2 3; do conv --workers 12; conv --workers 13; conv; done
rm -rf /dev/shm/out
