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

sanitize-thread:
	$(MAKE) test BUILD=build-tsan CMAKE_FLAGS="-DFLOWTRAIN_SANITIZE=thread -DFLOWTRAIN_BUILD_BENCHMARKS=OFF"

clean:
	rm -rf build build-asan build-tsan
