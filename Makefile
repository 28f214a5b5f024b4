# anvil: the two commands are `make run` (train the embedded default) and `make test` (the whole suite).
# Both install missing system packages first (scripts/deps.sh) and build in Release.
#   make run ARGS="--steps 200"     pass flags to `anvil train`
#   make CUDA=OFF                   build without the CUDA backend (default AUTO: when nvcc is found)
#   make bench                      CPU training throughput against PyTorch, then every op's rate

MAKEFLAGS += --no-print-directory

BUILD ?= build
CUDA ?= AUTO
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps configure build run python test test-emu bench clean

# A new build tree uses Ninja where it is installed (scripts/deps.sh installs it): it compiles the layers above
# a library while that library is still compiling, where make's generator waits, a fifth off a first build
# on 2 cores. A tree configured already keeps its generator. (Shell code: deps.sh runs before it is evaluated.)
cmake_gen = $$([ -f $(1)/CMakeCache.txt ] || ! command -v ninja > /dev/null || echo "-G Ninja")

all: build

deps:
	@scripts/deps.sh

configure: deps
	@cmake $(call cmake_gen,$(BUILD)) -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DANVIL_CUDA=$(CUDA) $(CMAKE_FLAGS) > $(BUILD).configure.log 2>&1 \
	  || { cat $(BUILD).configure.log; exit 1; }

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

# The first contact on a bare machine: only what the binary needs (scripts/deps.sh --run), only the binary, and
# the CUDA backend only where it can run (an NVIDIA device is visible) or where CUDA=ON asks for it. A tree that
# is configured already (by `make test`, say) keeps its settings.
GPU_VISIBLE := $(shell (nvidia-smi -L 2>/dev/null | grep -q '^GPU') && echo yes)
configure_where_usable = \
	if [ ! -f $(BUILD)/CMakeCache.txt ] || [ "$(origin CUDA)" = "command line" ]; then \
	  cuda=$(CUDA); if [ "$(origin CUDA)" != "command line" ] && [ -z "$(GPU_VISIBLE)" ]; then cuda=OFF; fi; \
	  cmake $(call cmake_gen,$(BUILD)) -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DANVIL_CUDA=$$cuda $(CMAKE_FLAGS) > $(BUILD).configure.log 2>&1 \
	    || { cat $(BUILD).configure.log; exit 1; }; fi
run:
	@if [ ! -x $(BUILD)/anvil ]; then \
	  echo "make run: installs what the anvil binary needs (if missing), builds it (2 to 3 minutes on 2 cores$(if $(GPU_VISIBLE),; more with the CUDA backend)), then trains the embedded demo (1 to 2 minutes on 2 cores)"; fi
	@scripts/deps.sh --run
	@$(configure_where_usable)
	@cmake --build $(BUILD) -j $(JOBS) --target anvil
	$(BUILD)/anvil train $(ARGS)

# The Python package: the native module beside python/anvil's files in $(BUILD)/python, for Debian's python3
# (PYTHONPATH=$(BUILD)/python /usr/bin/python3 -c "import anvil"). Installs only what it needs (scripts/deps.sh
# --python); the CUDA backend is in it where `make run` would build it. A tree configured before pybind11 was
# installed looks for it again.
python:
	@scripts/deps.sh --python
	@$(configure_where_usable)
	@cmake $(BUILD) > $(BUILD).configure.log 2>&1 || { cat $(BUILD).configure.log; exit 1; }
	@cmake --build $(BUILD) -j $(JOBS) --target anvil_python
	@echo "make python: built $(BUILD)/python/anvil; PYTHONPATH=$(BUILD)/python /usr/bin/python3 -c 'import anvil'"

# Tests share the cores: one at a time, each with the whole machine (OpenMP threads spin-wait, so running
# two multi-threaded tests at once on a small machine costs far more than it saves).
# Each tree's slowest tests are printed at the end, pass or fail (scripts/slowest_tests.py), so the suite's
# cost stays visible.
test: build
	@(cd $(BUILD) && ctest --output-on-failure); rc=$$?; python3 scripts/slowest_tests.py $(BUILD) 10; exit $$rc
	@$(MAKE) test-emu

# The GPU tests with the CUDA backend's kernels run on the CPU (tests/cuemu), in a build tree of their own;
# it needs the CUDA toolkit's headers (no GPU) and is left out with CUDA=OFF. The emulator runs a kernel on
# one thread, so these tests run $(JOBS) at a time, each on one thread (tests/CMakeLists.txt).
EMU_BUILD ?= $(BUILD)-cuemu
test-emu: deps
	@if [ "$(CUDA)" = OFF ]; then echo "test-emu: skipped (CUDA=OFF)"; \
	elif ! command -v nvcc > /dev/null && [ ! -x /usr/local/cuda/bin/nvcc ]; then \
	  echo "test-emu: skipped (no CUDA toolkit: its headers are needed)"; \
	else \
	  cmake $(call cmake_gen,$(EMU_BUILD)) -S . -B $(EMU_BUILD) -DCMAKE_BUILD_TYPE=Release -DANVIL_CUDA_EMU=ON $(CMAKE_FLAGS) \
	    > $(EMU_BUILD).configure.log 2>&1 || { cat $(EMU_BUILD).configure.log; exit 1; }; \
	  cmake --build $(EMU_BUILD) -j $(JOBS) --target anvil_emu_checks || exit 1; \
	  (cd $(EMU_BUILD) && ctest --output-on-failure -j $(JOBS) -R '^gpu_tests'); rc=$$?; \
	  python3 scripts/slowest_tests.py $(EMU_BUILD) 6; exit $$rc; \
	fi

bench: build
	/usr/bin/python3 bench/cpu_train_bench.py --anvil $(BUILD)/anvil --json $(BUILD)/cpu_train_bench.json
	$(BUILD)/bench/anvil_op_bench --device cpu

clean:
	rm -rf $(BUILD) $(BUILD).configure.log
