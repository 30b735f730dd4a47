. bench/device/setup.sh
echo "== one-matrix kernels (main)"; timeout 60 python3 bench/quantize.py --device cuda --repeat 3 2>&1 | grep -E "^input|^cuda .*fp4convert( 16x16)? +[0-9]|mxfp8  fp4convert  " | tee $OUT/quantize-h200-dense-kernels.txt
echo "== segment kernels"; timeout 60 python3 bench/device/segments_dense.py --device cuda --repeat 3 2>&1 | grep -E "^input|^cuda .*fp4convert( 16x16)? +[0-9]|mxfp8  fp4convert  " | tee $OUT/quantize-h200-segment-kernels.txt
