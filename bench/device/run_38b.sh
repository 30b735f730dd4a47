# Stop 38, short (for little device time left; issue 15): the NVFP4 launch tests (the division-free
# persistent loop and the 3-stage launches), tests/megatron with FP4CONVERT_LOAD_STAGES=3, one round of
# bench/device/nvfp4_ab.py (the defaults, FP4CONVERT_LOAD_STAGES=3, FP4CONVERT_PREFETCH=1, $BASE's
# defaults: 735ab50, before the division-free loop), and the sync rows with the defaults (48 layers
# where they fit) while under 250 s. Everything also goes to $OUT/run.txt.
exec > >(tee $OUT/run.txt) 2>&1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
P="python3 -m pytest -o addopts=--import-mode=importlib -p no:cacheprovider -q"
gcc -O3 -std=c11 -ffp-contract=off -fno-fast-math -fno-math-errno -fno-trapping-math -shared -fPIC \
  -o $BASE/fp4convert/formats/_native.so $BASE/fp4convert/formats/_native.c -lm -lpthread
timeout 120 $P -m gpu tests/formats/test_cuda.py -n 12 -rfE -k "segment or large or dense or bf16_word" 2>&1 | tail -3
echo "== FP4CONVERT_LOAD_STAGES=3 tests/megatron"
FP4CONVERT_LOAD_STAGES=3 timeout 60 $P -m gpu tests/megatron -n 12 -rfE 2>&1 | tail -2
echo "== defaults"; timeout 40 python3 bench/device/nvfp4_ab.py | grep -v modelopt
echo "== FP4CONVERT_LOAD_STAGES=3"; FP4CONVERT_LOAD_STAGES=3 timeout 40 python3 bench/device/nvfp4_ab.py | grep -v modelopt
echo "== $BASE, defaults"; PYTHONPATH=$BASE:$PYTHONPATH timeout 40 python3 bench/device/nvfp4_ab.py | grep -v modelopt
echo "== FP4CONVERT_PREFETCH=1"; FP4CONVERT_PREFETCH=1 timeout 40 python3 bench/device/nvfp4_ab.py | grep -v modelopt
L=36; [ "$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)" -gt 100000 ] && L=48
if [ $SECONDS -lt 250 ]; then
  echo "== sync rows, $L layers, defaults"
  timeout 100 python3 bench/live_sync.py --layers $L --repeat 3 > $OUT/live_sync$L.txt 2>&1
  grep -E "^(export|LiveExporter|validate|device copy|NVFP4|MXFP8)" $OUT/live_sync$L.txt | cut -c1-170
  grep -hE "^bytes|!!|Error|error" $OUT/live_sync$L.txt | cut -c1-300
fi
echo "== $SECONDS s"
