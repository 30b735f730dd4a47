# Stop 43 (issue 15), an H200 (an H100 runs it: 36 layers). (1) bench/device/nvfp4_ab.py (te 1x16,
# amax, amax + quantize) under the knobs of _triton_segments, as PDL:KEEP_MB:OUT:IN:STAGES:AMAX_STAGES
# (FP4CONVERT_PDL, FP4CONVERT_L2_KEEP_MB, FP4CONVERT_OUT_POLICY, FP4CONVERT_IN_POLICY,
# FP4CONVERT_STAGES, FP4CONVERT_AMAX_STAGES), each row's bytes against the CPU's, the defaults first
# and last; (2) bench/device/first_call_profile.py: where the first calls' time goes.
# (3) the GPU tests of tests/megatron; (4) FP4CONVERT_SEG_STAGES 1 against 3 on an 8-layer live_sync.
# NO_PROFILE, NO_TESTS, NO_SEG: skip (2), (3), (4).
# Everything also goes to $OUT/run.txt.
exec > >(tee $OUT/run.txt) 2>&1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
for v in 0:0:::1:1 0:0:::2:1 0:0:::3:1 0:0:::3:3 1:0:::3:1 2:0:::3:1 0:40:::3:1 0:40:evict_first::3:1 \
         2:40:evict_first::3:1 2:0:::1:1 0:0:::1:1; do
  IFS=: read -r pdl keep out in stages astages <<< "$v"
  echo "== PDL:KEEP_MB:OUT:IN:STAGES:AMAX_STAGES $v"
  NVFP4_AB_SHORT=1 FP4CONVERT_PDL=$pdl FP4CONVERT_L2_KEEP_MB=$keep FP4CONVERT_OUT_POLICY=$out FP4CONVERT_IN_POLICY=$in \
    FP4CONVERT_STAGES=$stages FP4CONVERT_AMAX_STAGES=$astages timeout 60 python3 bench/device/nvfp4_ab.py
done
layers=$(python3 -c "import torch; print(48 if torch.cuda.get_device_properties(0).total_memory > 100e9 else 36)")
[ -z "$NO_PROFILE" ] && timeout 300 python3 bench/device/first_call_profile.py $layers
# (3) the GPU tests of tests/megatron (the exporter's and validator's binding changed this stop)
[ -z "$NO_TESTS" ] && { echo "== GPU tests of tests/megatron"; timeout 120 python3 -m pytest -o addopts=--import-mode=importlib \
  -p no:cacheprovider -q -m gpu tests/megatron -n 12 -rfE 2>&1 | tail -3; }
# (4) the segment kernels' column loop pipelined (FP4CONVERT_SEG_STAGES) on an 8-layer sync, against the default
[ -z "$NO_SEG" ] && for st in 1 3; do
  echo "== live_sync.py --layers 8, FP4CONVERT_SEG_STAGES=$st"
  FP4CONVERT_SEG_STAGES=$st timeout 150 python3 bench/live_sync.py --layers 8 --repeat 3 --skip-kernels 2>&1 \
    | grep -E "^(export_hf, steady|LiveExporter, steady|validate_export, steady|bytes|Traceback)|Error" | cut -c1-150
done
