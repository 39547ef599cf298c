# Thin wrapper: every target installs what is missing, then drives CMake (Release, into build/).
#   make demo   run the main job end to end
#   make test   build everything and run the whole test suite
BUILD ?= build
JOBS ?= 2
CMAKE_FLAGS ?=

.PHONY: deps configure build demo test bench docs sanitize-address sanitize-thread clean

deps:
	@scripts/install-deps

configure: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) > /dev/null

build: configure
	@cmake --build $(BUILD) -j$(JOBS)

demo: build
	$(BUILD)/apps/flowtrain/flowtrain run apps/flowtrain/configs/demo.yaml

test: build
	cd $(BUILD) && ctest -j$(JOBS) --output-on-failure

bench: build
	$(BUILD)/bench/bench_graph_overhead

docs: build
	scripts/stage-docs $(BUILD)/apps/flowtrain/flowtrain docs/config.md

# The graph tests under AddressSanitizer+UndefinedBehaviorSanitizer, and ThreadSanitizer.
sanitize-address:
	$(MAKE) test BUILD=build-asan CMAKE_FLAGS="-DFLOWTRAIN_SANITIZE=address -DFLOWTRAIN_BUILD_BENCHMARKS=OFF"

# ThreadSanitizer needs oneTBB itself instrumented (Debian's libtbb is not, so TSan misses its
# scheduler's happens-before edges and reports false races): scripts/build-tsan-tbb builds it from
# Debian's source into $(TSAN_TBB) once; the TSan build finds it there (TBB_DIR) and its binaries
# load it at run time through their build RPATH, which the ldd line checks.
TSAN_TBB := $(CURDIR)/build-tsan/onetbb-tsan
TSAN_OPTIONS ?= second_deadlock_stack=1 history_size=7
sanitize-thread:
	scripts/build-tsan-tbb $(TSAN_TBB)
	$(MAKE) build BUILD=build-tsan CMAKE_FLAGS="-DFLOWTRAIN_SANITIZE=thread -DFLOWTRAIN_BUILD_BENCHMARKS=OFF -DTBB_DIR=$(TSAN_TBB)/lib/cmake/TBB -DCMAKE_PREFIX_PATH=$(TSAN_TBB)"
	@ldd build-tsan/tests/graph_tests | grep -F '$(TSAN_TBB)/lib/libtbb.so' \
	  || { echo "sanitize-thread: graph_tests does not load the instrumented libtbb from $(TSAN_TBB)/lib" >&2; exit 1; }
	cd build-tsan && TSAN_OPTIONS="$(TSAN_OPTIONS)" ctest -j$(JOBS) --output-on-failure

clean:
	rm -rf build build-asan build-tsan
