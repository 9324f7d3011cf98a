# The README's two commands: `make run` (set up, then run the main job) and `make test`.
DATA ?= ../shared/data/locomo/locomo10.json
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup run demo test lint

$(BIN)/mnemos: pyproject.toml scripts/setup.sh
	bash scripts/setup.sh
	@touch $(BIN)/mnemos

setup: $(BIN)/mnemos

# Main job: migrations, the three workers as processes, LoCoMo published turn by turn into the
# stream, every question asked through the rq queue, quality and speed figures printed.
run: setup
	$(BIN)/mnemos bench service --data $(DATA)

demo: setup
	$(BIN)/mnemos demo

test: setup
	$(BIN)/python -m pytest -q

lint: setup
	$(BIN)/ruff check .
