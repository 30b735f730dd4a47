# Issue 13, this stop: the host, sha256 of one source file several ways (the per-file chain as a
# floor), the 16-thread probe and conversions with the faster native kernels, the timeline.
lscpu | grep -E 'Model name|^CPU\(s\)|Thread|Core|Socket|NUMA node\(s\)|L3'; grep -o -m1 -w sha_ni /proc/cpuinfo || echo "no sha_ni"
W=/tmp/fd; . bench/device/source.sh; ls -l $W/src
python3 bench/device/hash_probe.py $W/src/*.safetensors
python3 bench/device/gil_probe.py 768x2048 256
conv() { python3 - "$@" <<'PY'
import json, resource, subprocess, sys, time
cmd = [sys.executable, "-m", "fp4convert", "convert", "/tmp/fd/src", "/dev/shm/out", "--contract",
       "contracts/nvfp4-experts-per-token.yaml", "--max-shard-size", "500MB", "--json", "--quiet", "--overwrite", *sys.argv[1:]]
t = time.time(); out = subprocess.run(cmd, capture_output=True, text=True).stdout; wall = time.time() - t
r = json.loads(out[out.index("{"):]); u = resource.getrusage(resource.RUSAGE_CHILDREN)
print(f"seconds {r['seconds']:.2f} GB/s {r['source_bytes'] / 1e9 / r['seconds']:.2f} {({k: round(v, 2) for k, v in r['phases'].items()})} wall {wall:.1f} "
      f"user {u.ru_utime:.1f} sys {u.ru_stime:.1f} minflt {u.ru_minflt} nvcsw {u.ru_nvcsw} (cumulative)")
PY
}
echo "== 1 process"; conv; conv
echo "== --workers 12"; conv --workers 12
python3 bench/device/trace_convert.py $W/src /dev/shm/out --contract contracts/nvfp4-experts-per-token.yaml --max-shard-size 500MB --quiet --overwrite 2>&1 | tail -42
rm -rf /dev/shm/out
