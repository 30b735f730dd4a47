# Stop 40 (issue 15), what little device time was left after fifteen tries to start a machine: the lean
# part of run_40a.sh. (1) The word-path test (every bf16 in every nibble) for each way of gathering
# the codes (shift, horner, horner-hi). (2) bench/device/nvfp4_ab.py once for each. (3) live_sync.py
# on LAYERS (8) layers, no kernel rows: export_hf of a dict's items (one whole update, replayed) and of
# an iterator (streamed) against LiveExporter. Everything also goes to $OUT/run.txt.
exec > >(tee $OUT/run.txt) 2>&1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader; nproc
P="python3 -m pytest -o addopts=--import-mode=importlib -p no:cacheprovider -q"
timeout 60 $P -m gpu tests/formats/test_cuda.py -rfE -k bf16_word 2>&1 | tail -2
for v in shift horner horner-hi; do
  echo "== FP4CONVERT_E2M1_PACK=$v"; FP4CONVERT_E2M1_PACK=$v timeout 40 python3 bench/device/nvfp4_ab.py | grep -v modelopt
done
echo "== sync rows, ${LAYERS:-8} layers"
timeout 120 python3 bench/live_sync.py --layers ${LAYERS:-8} --repeat 3 --skip-kernels > $OUT/live_sync-${LAYERS:-8}.txt 2>&1
grep -E "^(export|LiveExporter|validate|device copy)|^bytes|Error" $OUT/live_sync-${LAYERS:-8}.txt | cut -c1-170
