#!/usr/bin/env bash
# This session's CPU queue, one job at a time: wait for the foundation runs, then the README's demo
# command in a fresh clone (timed), the TextBrewer side-by-side, and the MRPC methods suite.
set -uo pipefail
cd "$(dirname "$0")/.."
while pgrep -f run_foundation.sh > /dev/null; do sleep 20; done
if [ -n "${FRESH_CLONE:-}" ]; then
  (cd "$FRESH_CLONE" && git pull -q && /usr/bin/time -v bash -c \
    "python3 -m venv .venv && .venv/bin/pip install -q -e '.[minilm]' && DISTILKIT_DATA=../shared/data .venv/bin/distilkit demo") \
    > benchmarks/work-demo.log 2>&1
fi
python benchmarks/vs_textbrewer.py
distilkit bench benchmarks/suites/mrpc-methods.yaml
