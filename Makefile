# `make demo` runs the Streamlit demo, `make test` runs the test suite; both install what is missing first.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
TORCH_VERSION ?= 2.13.0
DEMO_ARGS ?=

.PHONY: install test lint demo clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==$(TORCH_VERSION)
	$(PIP) install -q -e ".[dev]"
	touch $@

test: install
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

demo: install  # DEMO_ARGS=--no-train serves the demo without training missing models
	$(VENV)/bin/medfaq demo $(DEMO_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
