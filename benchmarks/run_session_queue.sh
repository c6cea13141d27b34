#!/usr/bin/env bash
# This session's CPU queue, one job at a time: wait for the foundation runs, then the TextBrewer
# side-by-side, then the MRPC methods suite.
set -uo pipefail
cd "$(dirname "$0")/.."
while pgrep -f run_foundation.sh > /dev/null; do sleep 20; done
python benchmarks/vs_textbrewer.py
distilkit bench benchmarks/suites/mrpc-methods.yaml
