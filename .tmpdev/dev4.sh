python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD:$PWD/scripts
cd scripts && python3 op_trace.py --derive --layers 32 --replays 20 --format 4byte --paths auto,polled-A-load-only,polled-B-load-only,polled-bare --build-dir /tmp/qtrace > $OUT/trace4.log 2>&1; echo rc=$?
grep -vE "diag\)|SM clock|resolution" $OUT/trace4.log | cut -c1-110
