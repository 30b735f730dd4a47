# Issue 13: page faults / mmap_lock as the one-process bound? The same conversion under glibc
# malloc settings that keep freed memory (no trimming, no per-allocation mmap), with fault counts.
W=/tmp/fd; . bench/device/source.sh
C=contracts/nvfp4-experts-per-token.yaml
conv() { python3 - "$@" <<'PY'
import json, resource, subprocess, sys, time
cmd = [sys.executable, "-m", "fp4convert", "convert", "/tmp/fd/src", "/dev/shm/out", "--contract",
       "contracts/nvfp4-experts-per-token.yaml", "--max-shard-size", "500MB", "--json", "--quiet", "--overwrite", *sys.argv[1:]]
t = time.time(); out = subprocess.run(cmd, capture_output=True, text=True).stdout; wall = time.time() - t
r = json.loads(out[out.index("{"):]); u = resource.getrusage(resource.RUSAGE_CHILDREN)
print(f"seconds {r['seconds']:.2f} GB/s {r['source_bytes'] / 1e9 / r['seconds']:.2f} shards {r['phases']['shards']:.2f} wall {wall:.1f} "
      f"user {u.ru_utime:.1f} sys {u.ru_stime:.1f} minflt {u.ru_minflt} majflt {u.ru_majflt} nvcsw {u.ru_nvcsw} nivcsw {u.ru_nivcsw}")
PY
}
echo "== default"; conv; conv
echo "== MALLOC_MMAP_THRESHOLD_=4GiB MALLOC_TRIM_THRESHOLD_=64GiB"
MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=68719476736 conv
MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=68719476736 conv
echo "== + MALLOC_ARENA_MAX=2"; MALLOC_ARENA_MAX=2 MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=68719476736 conv
echo "== + --workers 8"; MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=68719476736 conv --workers 8
rm -rf /dev/shm/out
