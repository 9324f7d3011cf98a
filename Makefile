# The README's two commands: `make run` (set up, then run the main job) and `make test`.
# DATA: a LoCoMo file; empty: ../shared/data/locomo/locomo10.json if present, else the cached download,
# else `mnemos data fetch locomo` (see bench/common/fetch.py).
DATA ?=
LOCOMO_SHARED := ../shared/data/locomo/locomo10.json
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup run demo mcp-demo test test-under-load lint reranker reranker-folds reranker-locomo check-data

$(BIN)/mnemos: pyproject.toml constraints.txt scripts/setup.sh
	bash scripts/setup.sh
	@touch $(BIN)/mnemos

setup: $(BIN)/mnemos

# Main job: Redis/Postgres (embedded ones when none answers), migrations, the three workers as
# processes, the LoCoMo conversations the shipped reranker never saw published turn by turn as two
# tenants each, held-out suppression burn-in and evaluation through the rq queue, the in-process
# replay, a table; JSON and PNG under .mnemos/results/. RERANKER=dir to use another cross-encoder,
# RUN_ARGS="--limit 100" for a quick sample.
RERANKER ?=
RUN_ARGS ?=
run: check-data setup
	$(BIN)/mnemos --log-level WARNING bench service $(if $(DATA),--data $(DATA),) \
		$(if $(RERANKER),--reranker $(RERANKER),) $(RUN_ARGS)

# Fail before the install (minutes) when DATA is given and is not a file.
check-data:
	@test -z "$(DATA)" || test -f "$(DATA)" || { echo "make: no LoCoMo file at $(DATA) (relative to $(CURDIR)); run: make run DATA=/path/to/locomo10.json, or leave DATA out to use the shared copy or download it" >&2; exit 2; }

# Reproduce the shipped cross-encoder (mnemos/shipped/reranker): fine-tuned from the bundled MiniLM on fold 1/2 of
# LongMemEval-S's questions (MIT; stratified by question type, seed 0: the other half stays held out), hard negatives
# from each question's own haystack by the service's BM25 (its own speaker's turns first), one more negative per
# positive from another training question's evidence turn (same speaker first), every mined pair, peak learning
# rate 1e-4, 6 epochs, stored as fp16 safetensors with mnemos_provenance.json (sources, licences, question ids).
# RERANKER_OUT=dir writes elsewhere; docs/reranker.md.
LONGMEMEVAL_S ?= ../shared/data/longmemeval/longmemeval_s_498.json.xz
RERANKER_OUT ?= mnemos/shipped/reranker
reranker: setup
	$(BIN)/mnemos reranker train --longmemeval $(LONGMEMEVAL_S) --question-fold 1/2 --out $(RERANKER_OUT) \
		--no-dense --same-speaker --learning-rate 1e-4 --epochs 6 --evidence-negatives 1 --seed 0 --fp16

# The two cross-fitting models of the quality bench on LongMemEval: questions split in 2 folds stratified by
# question type (seed 0); models/lme-fold-N never saw fold N's questions and is the one that ranks them.
reranker-folds: setup
	for f in 1 2; do $(BIN)/mnemos reranker train --longmemeval $(LONGMEMEVAL_S) --question-fold $$f/2 \
		--out models/lme-fold-$$f --no-dense --same-speaker --learning-rate 1e-4 --epochs 6 \
		--evidence-negatives 1 --seed 0 || exit 1; done

# Research only, never committed: a LoCoMo-trained model (CC BY-NC 4.0 data, so the weights are too; loading
# it logs a warning). FOLD=conv-44,... picks the training conversations; LOCOMO_OUT the directory.
FOLD ?= conv-26,conv-30,conv-41,conv-42,conv-43
LOCOMO_OUT ?= models/locomo-fold-a
reranker-locomo: check-data setup
	$(BIN)/mnemos reranker train --data $(or $(DATA),$(LOCOMO_SHARED)) \
		--conversations $(FOLD) --out $(LOCOMO_OUT) --epochs 3 --seed 0

demo: setup
	$(BIN)/mnemos demo

# A remember/recall round trip through `mnemos mcp` (stdio) with the MCP SDK's own client (scripts/mcp_demo.py;
# MCP_DEMO_ARGS=--no-spawn when `mnemos up` already runs the workers).
MCP_DEMO_ARGS ?=
mcp-demo: setup
	$(BIN)/python scripts/mcp_demo.py $(MCP_DEMO_ARGS)

test: setup
	$(BIN)/python -m pytest -q

# The same suite with one busy loop per core beside it (scripts/test_under_load.sh): waits must be on
# conditions with deadlines, not on the machine being idle.
test-under-load: setup
	bash scripts/test_under_load.sh

# Static checks (CI runs them before the tests): ruff everywhere, mypy strict on mnemos/ and api/
# ([tool.mypy] in pyproject.toml).
lint: setup
	$(BIN)/ruff check .
	$(BIN)/mypy
