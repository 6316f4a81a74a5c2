# The two set-up commands of the README: `make demo` and `make test`.
# Both create .venv and install the project into it on a fresh machine.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test unit bench clean chromium bytecode

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[test]'
	touch $(STAMP)

demo: $(STAMP) bytecode
	$(VENV)/bin/rayq demo

# Tests marked own_process run ray start / ray stop: apart, after the others, in their
# own namespace where the machine allows it (tests/own_process.sh). The report page test
# renders in Debian's headless Chromium, installed here when missing.
test: $(STAMP) chromium bytecode
	$(PY) -m pytest -q tests -m "not own_process"
	PY=$(PY) bash tests/own_process.sh tests

chromium:
	command -v chromium >/dev/null || (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium)

# Every Ray worker (an actor, a task) imports rayq anew: its bytecode is written here
# once, where Python would otherwise compile it in each worker whenever it may not write
# its cache (PYTHONDONTWRITEBYTECODE): about 0.2 s of CPU a worker.
bytecode: $(STAMP)
	$(PY) -m compileall -q rayq actors tests benchmarks >/dev/null

unit: $(STAMP)
	$(PY) -m pytest -q tests/unit tests/contract

bench: $(STAMP)
	$(PY) benchmarks/store.py

clean:
	rm -rf $(VENV) .rayq-data
