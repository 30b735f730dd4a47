# Issue 13, this stop: the host, sha256 of one source file several ways (the per-file chain as a
# floor), the 16-thread probe and conversions with the faster native kernels, the timeline.
lscpu | grep -E 'Model name|^CPU\(s\)|Thread|Core|Socket|NUMA node\(s\)|L3'; grep -o -m1 -w sha_ni /proc/cpuinfo || echo "no sha_ni"
W=/tmp/fd; . bench/device/source.sh; ls -l $W/src
python3 bench/device/hash_probe.py $W/src/*.safetensors
python3 bench/device/gil_probe.py 768x2048 256
R=$PWD; conv() { python3 $R/bench/device/conv_once.py "$@"; }
echo "== 1 process"; conv; conv
echo "== --workers 12"; conv --workers 12
python3 bench/device/trace_convert.py $W/src /dev/shm/out --contract contracts/nvfp4-experts-per-token.yaml --max-shard-size 500MB --quiet --overwrite 2>&1 | tail -42
rm -rf /dev/shm/out
