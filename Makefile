# Two set-up commands on a fresh machine: `make demo` and `make test`.
# Both create .venv if missing and install PORT (building the C kernels) with torch pinned by constraints.txt.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
export PIP_CONSTRAINT := $(CURDIR)/constraints.txt
export PIP_DISABLE_PIP_VERSION_CHECK := 1

KERNEL_SRC := $(wildcard kernels/src/*.c kernels/include/*.h)
STAMP := $(VENV)/.port-installed

.PHONY: install demo test test-asan bench clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(VENV)/bin/python pyproject.toml setup.py constraints.txt $(KERNEL_SRC)
	$(PY) -m pip install -q -c constraints.txt -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(VENV)/bin/port demo

test: install
	$(PY) -m pytest -q tests

# Kernel tests, the hostile-program tests and the program fuzzer against an ASan+UBSan build of the C library
# (separate .so, quick parametrisation).
ASAN_LIB := $(CURDIR)/kernels/build/asan/libport_kernels_asan.so
test-asan: install
	$(PY) setup.py -q build_asan
	PORT_KERNELS_LIB=$(ASAN_LIB) PORT_KERNELS_QUICK=1 \
	LD_PRELOAD="$$(gcc -print-file-name=libasan.so) $$(gcc -print-file-name=libubsan.so)" \
	ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	$(PY) -m pytest -q -s -p no:cacheprovider tests/kernels tests/unit/test_fuzz_program.py tests/unit/test_hostile_program.py

bench: install
	$(PY) bench/kernels.py --quick

clean:
	rm -rf build kernels/build port/*.so port/exec/*.so *.egg-info
