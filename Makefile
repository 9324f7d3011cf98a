# The README's two commands: `make run` (set up, then run the main job) and `make test`.
DATA ?= ../shared/data/locomo/locomo10.json
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup run demo test lint reranker check-data

$(BIN)/mnemos: pyproject.toml scripts/setup.sh
	bash scripts/setup.sh
	@touch $(BIN)/mnemos

setup: $(BIN)/mnemos

# Main job: migrations, the three workers as processes, LoCoMo published turn by turn into the
# stream, every question asked through the rq queue, quality and speed figures printed.
RERANKER ?= models/locomo-fold-a
run: check-data setup
	$(BIN)/mnemos bench service --data $(DATA) $(if $(wildcard $(RERANKER)/config.json),--reranker $(RERANKER),)

# Fail before the install (minutes) when the data is not where DATA says.
check-data:
	@test -f "$(DATA)" || { echo "make: no LoCoMo file at $(DATA) (relative to $(CURDIR)); run: make run DATA=/path/to/locomo10.json" >&2; exit 2; }

# Fine-tune a cross-encoder from the bundled MiniLM on LoCoMo conversations 1-5 (fold a);
# `make run` then evaluates it on conversations 6-10, which it never saw.
reranker: check-data setup
	$(BIN)/mnemos reranker train --data $(DATA) --conversations conv-26,conv-30,conv-41,conv-42,conv-43 \
		--out $(RERANKER) --max-pairs 10000 --epochs 1 --seed 0

demo: setup
	$(BIN)/mnemos demo

test: setup
	$(BIN)/python -m pytest -q

lint: setup
	$(BIN)/ruff check .
