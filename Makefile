# Two commands do all the set-up on a fresh machine:
#   make demo   installs everything, builds the tiny model, runs the CPU demo sweep against real vLLM
#   make test   installs everything (Prometheus and Chromium too) and runs the whole test suite (unit, integration, e2e)
PYTHON ?= python3
VENV := .venv
VLLM_VENV := .venv-vllm
MODEL_DIR := .cache/tiny-llama
PY := $(VENV)/bin/python
DEMO_OUT ?= results/cpu-demo
PYTEST_ARGS ?=

.PHONY: install vllm model prometheus chromium demo test unit integration e2e bench docs docs-serve docs-ref clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,ray,docs]'
	touch $@

install: $(VENV)/.installed

vllm:
	PYTHON=$(PYTHON) VLLM_VENV=$(CURDIR)/$(VLLM_VENV) bash scripts/setup-vllm.sh

model: vllm
	bash scripts/build-tiny-model.sh $(MODEL_DIR)

# A real Prometheus scrapes the exporter in the tests, and promtool checks docker/prometheus.yml.
prometheus:
	bash scripts/setup-prometheus.sh

# A headless Chromium opens report.html in the tests (console errors, requests, screenshots).
chromium:
	bash scripts/setup-chromium.sh

# The demo's server command is vLLM's module form (`python -m vllm...`), so the vLLM environment's
# python goes first on PATH; the planner itself runs from its own environment.
demo: install model
	PATH="$(CURDIR)/$(VLLM_VENV)/bin:$$PATH" PLANNER_TINY_MODEL=$(CURDIR)/$(MODEL_DIR) \
	  $(VENV)/bin/planner sweep --config examples/cpu-demo.toml --output $(DEMO_OUT)

# pytest exits 5 when it collected no test; that must fail, not pass quietly.
define run_pytest
	PLANNER_TINY_MODEL=$(CURDIR)/$(MODEL_DIR) PLANNER_VLLM_VENV=$(CURDIR)/$(VLLM_VENV) \
	  $(PY) -m pytest $(1) $(PYTEST_ARGS); rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing"; exit 1; fi; exit $$rc
endef

test: prometheus chromium install model
	$(call run_pytest,tests)

unit: install
	$(call run_pytest,tests/unit)

integration: prometheus chromium install
	$(call run_pytest,tests/integration)

e2e: install model
	$(call run_pytest,-m e2e tests)

# With the tiny model's tokenizer the benchmark also runs vLLM's own client against the same server.
bench: install model
	PLANNER_TINY_MODEL=$(CURDIR)/$(MODEL_DIR) $(PY) benchmarks/client_overhead.py

# The documentation site, into site/: the reference pages are checked against the code first, then
# `mkdocs build --strict` fails on any broken link, missing page or unknown anchor.
docs: install
	$(PY) scripts/gen_docs_reference.py --check
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

# The built site on http://127.0.0.1:8000 (search included), until Ctrl-C.
docs-serve: docs
	$(PY) -m http.server --bind 127.0.0.1 --directory site 8000

# Rewrites docs/reference/ from the code (commands, config keys, result fields, metrics, errors).
docs-ref: install
	$(PY) scripts/gen_docs_reference.py

clean:
	rm -rf $(VENV) .pytest_cache site
