# gpc: the README's commands.
#   make run    set up, build, and run the main job (train on the bundled corpus, then sample)
#   make test   set up, build, and run every test (plus a sanitizer build of the tests)
#   make        build into build/ (the command is build/gpc, the daemon build/gpcd)

JOBS ?= $(shell nproc 2>/dev/null || echo 2)
BUILD ?= build
CMAKE_FLAGS ?=

.PHONY: all build setup setup-test run test test-fast test-asan format clean

all: build

build:
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

setup:
	@scripts/setup.sh

setup-test:
	@scripts/setup.sh --test

run: setup build
	@scripts/main-job.sh

test: setup-test build
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS)
	@$(MAKE) --no-print-directory test-asan

# Fast loop while developing: no setup, no sanitizer build.
test-fast: build
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# The same tests built with AddressSanitizer and UndefinedBehaviorSanitizer
# (CPU paths; the CUDA backend is left out of this build).
test-asan:
	@cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DGPC_SANITIZE=ON -DGPC_ENABLE_CUDA=OFF >/dev/null
	@cmake --build build-asan -j $(JOBS)
	@cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp \
	  ctest --output-on-failure -j $(JOBS) -E '^(bench_|cli_test_main_job)'

format:
	@clang-format -i $$(git ls-files '*.c' '*.h' '*.cu' '*.cuh')

clean:
	rm -rf build build-asan
