# Issue 13: this stop's changes (hash children, reads into reused buffers, writes compared on the
# spot instead of hashed again) against the previous revision in _base/, interleaved, then the timeline.
W=/tmp/fd; . bench/device/source.sh
gcc -O3 -std=c11 -ffp-contract=off -fno-fast-math -fno-math-errno -fno-trapping-math -shared -fPIC \
  -o _base/fp4convert/formats/_native.so _base/fp4convert/formats/_native.c -lm -lpthread
R=$PWD; conv() { python3 $R/bench/device/conv_once.py "$@"; }
for i in $(seq ${RUNS:-3}); do
  echo "== previous revision"; (cd _base && PYTHONPATH=/tmp/site:$PWD conv)
  echo "== this revision"; conv
done
echo "== this revision --workers 12"; conv --workers 12
echo "== this revision --workers 20"; conv --workers 20
python3 bench/device/trace_convert.py $W/src /dev/shm/out --contract contracts/nvfp4-experts-per-token.yaml --max-shard-size 500MB --quiet --overwrite 2>&1 | tail -42
rm -rf /dev/shm/out
