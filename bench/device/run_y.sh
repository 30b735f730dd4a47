# Issue 15, stop 27, second batch: steady export and validate on 48 layers, wall time against the
# GPU's busy time and cProfile: this revision (its validator also with the two-step NVFP4 compare),
# then stop 26's (put in _base/ first: mkdir _base && git archive 2b9250d fp4convert contracts | tar -x -C _base),
# then every sync row of live_sync.
timeout 60 python3 -m pytest -m gpu tests/formats/test_cuda.py -q -n 4 -k "hardware_e4m3 or mxfp8 or one_pass or outer_scales" -p no:cacheprovider 2>&1 | tail -2
timeout 150 python3 bench/device/validate_profile.py 48 > $OUT/validate_profile.txt 2>&1
grep -v -E "^$|^-+$|Ordered by|List reduced|^ +ncalls" $OUT/validate_profile.txt | cut -c1-170 | head -75
PYTHONPATH=$PWD/_base:/tmp/site timeout 120 python3 bench/device/validate_profile.py 48 > $OUT/validate_profile_base.txt 2>&1
grep -E "^==" $OUT/validate_profile_base.txt; grep -A 12 "== ExportValidator" $OUT/validate_profile_base.txt | grep -v -E "^$|^-+$" | cut -c1-170 | head -12
timeout 250 python3 bench/live_sync.py --skip-kernels --repeat 3 > $OUT/live_sync48.txt 2>&1
sed -n '/^summary/,$p' $OUT/live_sync48.txt; grep -E "^bytes" $OUT/live_sync48.txt
# issue 13: one process into a fresh folder, three times (the 6.23 GB source drawn on the GPU)
W=/tmp/fd; timeout 60 bash -c '. bench/device/source.sh'
for i in 1 2 3; do timeout 30 python3 bench/device/conv_once.py --fresh; done
