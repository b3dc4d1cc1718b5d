#!/usr/bin/env bash
# Run the starvation lab under `gpumon record`, label the recording with the lab's phases
# and analyse it: the one command to run on a GPU machine.
#
#   examples/record_lab.sh OUT_DIR [starvation_lab.py options, e.g. --phase-seconds 30]
#
# OUT_DIR gets: lab.jsonl.gz (the labelled trace, for tests/data/real/), lab-phases.jsonl,
# lab-report.txt and lab-report.json (gpumon analyze), and the stderr of each step.
# Run from the repository root with gpumon importable (pip install -e . or PYTHONPATH).
set -u
out=${1:?usage: examples/record_lab.sh OUT_DIR [starvation_lab.py options]}
shift
mkdir -p "$out" || exit
py=${PYTHON:-python3}

"$py" examples/starvation_lab.py --phase-log "$out/lab-phases.jsonl" "$@" \
    > "$out/lab-stdout.jsonl" 2> "$out/lab-stderr.txt" &
lab=$!
# The lab's whole process tree (its DataLoader workers included) is recorded until it exits.
"$py" -m gpumon record --pid "$lab" -o "$out/lab-raw.jsonl" 2> "$out/record-stderr.txt"
rec_rc=$?
wait "$lab"
lab_rc=$?
echo "lab exit status $lab_rc, record exit status $rec_rc" >&2
if [ "$lab_rc" -ne 0 ]; then
    cat "$out/lab-stderr.txt" >&2
fi
"$py" examples/label_trace.py "$out/lab-raw.jsonl" "$out/lab-phases.jsonl" -o "$out/lab.jsonl" \
    || exit
"$py" -m gpumon analyze "$out/lab.jsonl" > "$out/lab-report.txt" 2>&1
"$py" -m gpumon analyze --json "$out/lab.jsonl" > "$out/lab-report.json" 2>&1
gzip -9 -f -k "$out/lab.jsonl"
cat "$out/lab-report.txt"
exit "$lab_rc"
