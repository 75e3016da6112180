# Two set-up commands on a fresh machine: `make demo` and `make test`.
# Both create .venv if missing and install PORT (building the C kernels) with torch pinned by constraints.txt.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
export PIP_CONSTRAINT := $(CURDIR)/constraints.txt
export PIP_DISABLE_PIP_VERSION_CHECK := 1

KERNEL_SRC := $(wildcard kernels/src/*.c kernels/runtime/*.c kernels/include/*.h)
STAMP := $(VENV)/.port-installed

.PHONY: install demo test test-asan bench clean port-rt

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

# port-rt: the Python-free runtime (kernels + kernels/runtime + kernels/cli), portable flags, OpenBLAS from the
# venv's scipy-openblas32 wheel (the same GEMM the Python executor uses); PORT_RT_BLAS=0 builds the vendored GEMM only.
RT_BIN := kernels/build/port-rt
RT_SRC := $(wildcard kernels/src/*.c kernels/runtime/*.c) kernels/cli/port_rt_main.c
RT_CFLAGS := -O3 -std=c11 -fopenmp -fno-trapping-math -Wall -Wextra -Wno-unused-parameter -D_GNU_SOURCE \
	-Ikernels/include -Ikernels/src
port-rt: $(RT_BIN)
$(RT_BIN): $(STAMP) $(RT_SRC) $(wildcard kernels/include/*.h kernels/src/*.h)
	@mkdir -p kernels/build
	@if [ "$${PORT_RT_BLAS:-1}" = 1 ] && $(PY) -c "import scipy_openblas32" 2>/dev/null; then \
	  inc=$$($(PY) -c "import scipy_openblas32 as o; print(o.get_include_dir())"); \
	  lib=$$($(PY) -c "import scipy_openblas32 as o; print(o.get_lib_dir())"); \
	  set -x; gcc $(RT_CFLAGS) -DPORT_HAVE_OPENBLAS=1 -I$$inc $(RT_SRC) -o $@ -L$$lib -lscipy_openblas \
	    -Wl,-rpath,$$lib -lm; \
	else set -x; gcc $(RT_CFLAGS) $(RT_SRC) -o $@ -lm; fi

clean:
	rm -rf build kernels/build port/*.so port/exec/*.so *.egg-info
