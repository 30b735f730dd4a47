# Issue 13: this stop's changes (hash children, reads into reused buffers, writes compared on the
# spot instead of hashed again) against the previous revision in _base/, interleaved, then the timeline.
W=/tmp/fd; . bench/device/source.sh
gcc -O3 -std=c11 -ffp-contract=off -fno-fast-math -fno-math-errno -fno-trapping-math -shared -fPIC \
  -o _base/fp4convert/formats/_native.so _base/fp4convert/formats/_native.c -lm -lpthread
conv() { python3 - "$@" <<'PY'
import json, resource, subprocess, sys, time
cmd = [sys.executable, "-m", "fp4convert", "convert", "/tmp/fd/src", "/dev/shm/out", "--contract",
       "contracts/nvfp4-experts-per-token.yaml", "--max-shard-size", "500MB", "--json", "--quiet", "--overwrite", *sys.argv[1:]]
before = resource.getrusage(resource.RUSAGE_CHILDREN)
t = time.time(); proc = subprocess.run(cmd, capture_output=True, text=True); out = proc.stdout; wall = time.time() - t
if "{" not in out: print(proc.stderr[-3000:]); sys.exit(0)
r = json.loads(out[out.index("{"):]); u = resource.getrusage(resource.RUSAGE_CHILDREN)
print(f"seconds {r['seconds']:.2f} GB/s {r['source_bytes'] / 1e9 / r['seconds']:.2f} {({k: round(v, 2) for k, v in r['phases'].items()})} wall {wall:.1f} "
      f"user {u.ru_utime - before.ru_utime:.1f} sys {u.ru_stime - before.ru_stime:.1f} minflt {u.ru_minflt - before.ru_minflt} nvcsw {u.ru_nvcsw - before.ru_nvcsw}")
PY
}
for i in $(seq ${RUNS:-3}); do
  echo "== previous revision"; (cd _base && PYTHONPATH=/tmp/site:$PWD conv)
  echo "== this revision"; conv
done
echo "== this revision --workers 12"; conv --workers 12
echo "== this revision --workers 20"; conv --workers 20
python3 bench/device/trace_convert.py $W/src /dev/shm/out --contract contracts/nvfp4-experts-per-token.yaml --max-shard-size 500MB --quiet --overwrite 2>&1 | tail -42
rm -rf /dev/shm/out
