# Two set-up commands on a fresh machine: `make demo` and `make test` (the fast tier; `make test-all` runs every
# test, as .ci/run does).
# Both create .venv if missing and install PORT (building the C kernels) with torch pinned by constraints.txt.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
export PIP_CONSTRAINT := $(CURDIR)/constraints.txt
export PIP_DISABLE_PIP_VERSION_CHECK := 1

KERNEL_SRC := $(wildcard kernels/src/*.c kernels/runtime/*.c kernels/include/*.h)
STAMP := $(VENV)/.port-installed

.PHONY: install demo test test-all test-asan docs bench profiles clean port-rt port-rt-asan port-rt-portable port-rt-aarch64 port-rt-m4

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(VENV)/bin/python pyproject.toml setup.py constraints.txt $(KERNEL_SRC)
	$(PY) -m pip install -q -c constraints.txt -e '.[dev,federated,zoo,docs,opencl]'
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(VENV)/bin/port demo

# The fast tier: every test but those marked slow (federation rounds, cross and MCU builds, the zoo's largest
# models, README blocks that train; pyproject.toml registers the marker). test-all: everything. Both list the 25
# slowest tests (pick what to mark slow from them) and run on pytest-xdist workers (PYTEST_WORKERS, default one
# per CPU; tests/conftest.py gives each worker its share of the OpenMP threads, tests/buildlock.py serialises
# `make`). PYTEST_WORKERS=0 runs in this process (a debugger, -s output).
PYTEST_WORKERS ?= auto
PYTEST_XDIST := -n $(PYTEST_WORKERS) --dist worksteal
test: install
	$(PY) -m pytest -q -m "not slow" $(PYTEST_XDIST) --durations=25 tests

test-all: install
	$(PY) -m pytest -q $(PYTEST_XDIST) --durations=25 tests

# Kernel tests, the hostile-program tests, the program fuzzer and the call rule's tests against an ASan+UBSan
# build of the C library (separate .so, quick parametrisation); the bundle fuzzer (300 mutants) against an
# ASan+UBSan build of port-rt (kernels/build/port-rt-asan), so a write outside the arena fails. On the xdist
# workers like test/test-all (LD_PRELOAD and the sanitizer options reach them through the environment).
ASAN_LIB := $(CURDIR)/kernels/build/asan/libport_kernels_asan.so
RT_ASAN_BIN := kernels/build/port-rt-asan
test-asan: install $(RT_ASAN_BIN)
	$(PY) setup.py -q build_asan
	PORT_KERNELS_LIB=$(ASAN_LIB) PORT_KERNELS_QUICK=1 PORT_RT_BIN=$(CURDIR)/$(RT_ASAN_BIN) \
	LD_PRELOAD="$$(gcc -print-file-name=libasan.so) $$(gcc -print-file-name=libubsan.so)" \
	ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	$(PY) -m pytest -q -p no:cacheprovider $(PYTEST_XDIST) tests/kernels tests/unit/test_fuzz_program.py \
	  tests/unit/test_hostile_program.py tests/unit/test_call_rule.py
	PORT_RT_BIN=$(CURDIR)/$(RT_ASAN_BIN) PORT_FUZZ_BUNDLES=300 $(PY) -m pytest -q -p no:cacheprovider \
	  tests/unit/test_fuzz_bundle.py

# The documentation site (mkdocs.yml) into site/; --strict: a broken link, a missing snippet or API object fails
docs: install
	$(VENV)/bin/mkdocs build --strict -q

bench: install
	$(PY) bench/kernels.py --quick

# the committed profiles of the modeled devices (profiles/README.md)
profiles: install
	$(VENV)/bin/port profile --all-modeled

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

# port-rt with AddressSanitizer and UndefinedBehaviorSanitizer (vendored GEMM), for test-asan's bundle fuzzer
port-rt-asan: $(RT_ASAN_BIN)
$(RT_ASAN_BIN): $(RT_SRC) $(wildcard kernels/include/*.h kernels/src/*.h)
	@mkdir -p kernels/build
	gcc $(RT_CFLAGS) -O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined \
	  $(RT_SRC) -o $@ -lm

# The portable flavour: vendored GEMM only and -ffp-contract=off (no fused multiply-add contraction), so its
# results are bit-identical on every ISA; port-rt-aarch64 is the same cross-built for aarch64 Linux (static, runs
# under qemu-aarch64). Tools: apt-get install gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user
RT_PORTABLE_CFLAGS := $(RT_CFLAGS) -ffp-contract=off
port-rt-portable: kernels/build/port-rt-portable
kernels/build/port-rt-portable: $(RT_SRC) $(wildcard kernels/include/*.h kernels/src/*.h)
	@mkdir -p kernels/build
	gcc $(RT_PORTABLE_CFLAGS) $(RT_SRC) -o $@ -lm
port-rt-aarch64: kernels/build/port-rt-aarch64
kernels/build/port-rt-aarch64: $(RT_SRC) $(wildcard kernels/include/*.h kernels/src/*.h)
	@mkdir -p kernels/build
	@# static libgomp warns about dlopen in static binaries (OpenACC profiling, unused): the log keeps it
	aarch64-linux-gnu-gcc $(RT_PORTABLE_CFLAGS) $(RT_SRC) -o $@ -static -lm 2>$@.log || { cat $@.log; rm -f $@; exit 1; }

# Cortex-M4 (no OS, no malloc): port-rt with a bundle compiled in (`port compile ... --emit-c -o DIR`, then
# `make port-rt-m4 M4_BUNDLE=DIR`), for the MPS2 AN386 board under qemu-system-arm (semihosting output):
#   qemu-system-arm -M mps2-an386 -nographic -semihosting-config enable=on,target=native -kernel DIR/port-rt-m4.elf
# Tools: apt-get install gcc-arm-none-eabi libnewlib-arm-none-eabi qemu-system-arm
M4_FLAGS := -mcpu=cortex-m4 -mthumb -mfloat-abi=hard -mfpu=fpv4-sp-d16 -O2 -std=c11 -ffp-contract=off -DPORT_DW_PAD_MAX=0 -DPORT_WG_ROW_MAX=72 -DPORT_LIN_KSPLIT=0 \
	-fno-trapping-math -Wall -Wno-unused-parameter -Wno-unknown-pragmas -ffunction-sections -fdata-sections \
	-Ikernels/include -Ikernels/src
port-rt-m4:
	@test -n "$(M4_BUNDLE)" -a -f "$(M4_BUNDLE)/port_bundle.c" -a -f "$(M4_BUNDLE)/port_data.c" || \
	  { echo "make port-rt-m4 M4_BUNDLE=DIR: DIR must hold port_bundle.c/.h and port_data.c (port compile --emit-c)"; exit 2; }
	arm-none-eabi-gcc $(M4_FLAGS) -I$(M4_BUNDLE) $(wildcard kernels/src/*.c kernels/runtime/*.c) \
	  kernels/mcu/main_m4.c kernels/mcu/startup_m4.c $(M4_BUNDLE)/port_bundle.c $(M4_BUNDLE)/port_data.c \
	  -T kernels/mcu/mps2_an386.ld --specs=rdimon.specs -Wl,--gc-sections -lm -o $(M4_BUNDLE)/port-rt-m4.elf
	arm-none-eabi-size $(M4_BUNDLE)/port-rt-m4.elf

clean:
	rm -rf build kernels/build port/*.so port/exec/*.so *.egg-info site
