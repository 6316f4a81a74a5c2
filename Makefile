# The two set-up commands of the README: `make demo` and `make test`.
# Both create .venv and install the project into it on a fresh machine.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test unit bench clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/rayq demo

test: $(STAMP)
	$(PY) -m pytest -q tests

unit: $(STAMP)
	$(PY) -m pytest -q tests/unit tests/contract

bench: $(STAMP)
	$(PY) benchmarks/store.py

clean:
	rm -rf $(VENV) .rayq-data
