# Stop 38, on an H200 where one is lent (issue 15). In order of need, each step only while time is left
# (the call's limit is 595 s): (1) the NVFP4 launch tests, whose launches now include the persistent
# loop without divisions and the loads pipelined through shared memory (STAGES); tests/megatron (the
# exporter's and validator's segment kernels) with FP4CONVERT_LOAD_STAGES=3. (2) bench/device/nvfp4_ab.py,
# alternating, two rounds: the defaults, FP4CONVERT_LOAD_STAGES=3 and 2, FP4CONVERT_PREFETCH=1, and the
# defaults of $BASE (a git archive of 735ab50's fp4convert/, before the division-free loop). (3) The
# 48-layer sync rows (36 where 48 do not fit): the defaults, then FP4CONVERT_LOAD_STAGES=3.
# (4) bench/device/wave_lab.py. (5) Every GPU test with the defaults. Everything also goes to $OUT/run.txt.
exec > >(tee $OUT/run.txt) 2>&1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; nproc
P="python3 -m pytest -o addopts=--import-mode=importlib -p no:cacheprovider -q"
before() { [ $SECONDS -lt $1 ] || { echo "== (skipped: $SECONDS s gone)"; false; }; }
gcc -O3 -std=c11 -ffp-contract=off -fno-fast-math -fno-math-errno -fno-trapping-math -shared -fPIC \
  -o $BASE/fp4convert/formats/_native.so $BASE/fp4convert/formats/_native.c -lm -lpthread
timeout 120 $P -m gpu tests/formats/test_cuda.py -n 12 -rfE -k "segment or large or dense or bf16_word" 2>&1 | tail -4
echo "== FP4CONVERT_LOAD_STAGES=3 tests/megatron"
FP4CONVERT_LOAD_STAGES=3 timeout 60 $P -m gpu tests/megatron -n 12 -rfE 2>&1 | tail -4
for i in 1 2; do
  before 330 || break
  echo "== defaults"; timeout 40 python3 bench/device/nvfp4_ab.py | grep -v modelopt
  echo "== FP4CONVERT_LOAD_STAGES=3"; FP4CONVERT_LOAD_STAGES=3 timeout 40 python3 bench/device/nvfp4_ab.py | grep -v modelopt
  echo "== FP4CONVERT_LOAD_STAGES=2"; FP4CONVERT_LOAD_STAGES=2 timeout 40 python3 bench/device/nvfp4_ab.py | grep -v modelopt
  echo "== FP4CONVERT_PREFETCH=1"; FP4CONVERT_PREFETCH=1 timeout 40 python3 bench/device/nvfp4_ab.py | grep -v modelopt
  echo "== $BASE, defaults"; PYTHONPATH=$BASE:$PYTHONPATH timeout 40 python3 bench/device/nvfp4_ab.py | grep -v modelopt
done
L=36; [ "$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)" -gt 100000 ] && L=48
for stages in 1 3; do
  before 470 || break
  echo "== sync rows, $L layers, FP4CONVERT_LOAD_STAGES=$stages"
  FP4CONVERT_LOAD_STAGES=$stages timeout 110 python3 bench/live_sync.py $([ $stages = 1 ] || echo --skip-kernels) \
    --layers $L --repeat 3 > $OUT/live_sync$L-stages$stages.txt 2>&1
  grep -E "^(export|LiveExporter|validate|device copy|NVFP4|MXFP8)" $OUT/live_sync$L-stages$stages.txt | cut -c1-170
  grep -hE "^bytes|!!|Error|error" $OUT/live_sync$L-stages$stages.txt | cut -c1-300
done
before 510 && timeout 70 python3 bench/device/wave_lab.py
before 440 && { echo "== every GPU test"; timeout 140 $P -m gpu tests/formats tests/megatron -n 12 -rfE 2>&1 | tail -6; }
echo "== $SECONDS s"
