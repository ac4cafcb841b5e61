#!/usr/bin/env bash
# Installs what the test suite needs (pip packages at the versions of constraints.txt, into the active
# virtual environment or .venv; Debian's iverilog, yosys and make when run as root), then runs
# the RTL simulations, the Yosys synthesis estimate, and the Python test suite. The README's test command.
set -euo pipefail
cd "$(dirname "$0")/.."
missing=()
for tool in iverilog yosys make; do command -v "$tool" >/dev/null || missing+=("$tool"); done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "error: ${missing[*]} needed: sudo apt-get install -y ${missing[*]}" >&2; exit 2
  fi
fi
source scripts/python_env.sh requirements-test.txt
ruff check .
make -C fpga sim
make -C fpga synth-oss
python -m pytest -q "$@"
