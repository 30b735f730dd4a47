# Stop 29, fifth batch (an H100: 36 of the 48 layers fit its 80 GB with outputs and checks): every
# sync row of live_sync, then the steady export/validate profile of this revision and of stop 26's
# (_base/) on the same host.
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout 200 python3 bench/live_sync.py --skip-kernels --layers 36 --repeat 3 > $OUT/live_sync36.txt 2>&1
sed -n '/^summary/,$p' $OUT/live_sync36.txt; grep -E "^bytes|device memory|!!" $OUT/live_sync36.txt | cut -c1-200
timeout 90 python3 bench/device/validate_profile.py 36 > $OUT/validate_profile.txt 2>&1
grep -E "^==|wall|GPU|host" $OUT/validate_profile.txt | head -20
PYTHONPATH=$PWD/_base:/tmp/site timeout 80 python3 bench/device/validate_profile.py 36 > $OUT/validate_profile_base.txt 2>&1
grep -E "^==|wall|GPU|host" $OUT/validate_profile_base.txt | head -20
