#!/usr/bin/env bash
# Create .venv and install Mnemos for development: the service, its test tools (dev), embedded Redis and
# Postgres (embedded), and the benchmark part with reranker training (bench, train; `mnemos bench`,
# `mnemos reranker`, `mnemos data`, which `make run` needs), and the agents' doors (mcp: `mnemos mcp`;
# langchain: the retriever and the LangGraph store of integrations/), whose tests `make test` runs.
# The service image installs none of these.
# PyTorch goes first and pinned: pip then takes the local CPU build instead of a multi-GB CUDA one.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
. .venv/bin/activate
python -m pip install --quiet --upgrade pip
python -m pip install --quiet "torch==2.13.0"
# constraints.txt: every package at the version the test suite was last run with (rq and redis-py
# minor releases have changed worker shutdown before).
python -m pip install --quiet -c constraints.txt -e ".[dev,embedded,bench,train,mcp,langchain]"
echo "mnemos installed in $(pwd)/.venv"
