# Stop 34. (1) Issue 15: every sync row again, 694bff8 (_base/) FIRST and this tree second on the same
# machine (run_33a ran this tree first, on a fresh machine: its export rows came out slower than the
# base's and its validator rows faster; the order is reversed here to tell the code from the warm-up).
# (2) Issue 13: one-process conversions of the 6.23 GB source into a fresh folder, interleaved, 3
# rounds: ef45073 (_prev/) against this tree (hash children started before the plan, reading 1 MiB
# at a time instead of hashing the mapped file); then the hash-children probe on the source files,
# the timeline.
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; nproc
L=36; [ "$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)" -gt 100000 ] && L=48
for tree in base this; do
  if [ $tree = base ]; then P0=$PWD/_base:$PYTHONPATH; cp fp4convert/formats/_native.so _base/fp4convert/formats/; else P0=$PYTHONPATH; fi
  echo "== $tree"
  PYTHONPATH=$P0 timeout 150 python3 bench/live_sync.py --skip-kernels --layers $L --repeat 3 > $OUT/live_sync$L-$tree-2nd.txt 2>&1
  grep -E "^(export|LiveExporter|validate|device copy)" $OUT/live_sync$L-$tree-2nd.txt | cut -c1-170
  grep -E "^bytes|!!|Error|error" $OUT/live_sync$L-$tree-2nd.txt | cut -c1-300
done
W=/tmp/fd; timeout 90 bash -c '. bench/device/source.sh'; ls -la /tmp/fd/src | head
cp fp4convert/formats/_native.so _prev/fp4convert/formats/_native.so
R=$PWD; conv() { timeout 40 python3 $R/bench/device/conv_once.py --fresh "$@"; }
for i in 1 2 3; do
  echo -n "ef45073  "; (cd _prev && PYTHONPATH=/tmp/site:$PWD conv)
  echo -n "this     "; conv
done
timeout 60 python3 bench/device/hash_probe.py --children /tmp/fd/src/*.safetensors
rm -rf /dev/shm/out; timeout 60 python3 bench/device/trace_convert.py /tmp/fd/src /dev/shm/out --contract contracts/nvfp4-experts-per-token.yaml --max-shard-size 500MB -q > $OUT/trace.txt 2>&1; tail -30 $OUT/trace.txt
rm -rf /dev/shm/out
