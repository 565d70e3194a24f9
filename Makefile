# Ember's two commands: `make run` and `make test`. `make` alone builds build/ember.
BUILD ?= build
JOBS ?= 2
CMAKE_FLAGS ?=

.PHONY: all deps configure build run test fuzz clean

all: build

deps:
	@tools/deps.sh

# Configuring waits for deps (an order-only prerequisite: `make -j` would otherwise run cmake beside
# the install, and cmake fails on a package not installed yet) and runs once, when BUILD has no cache.
$(BUILD)/CMakeCache.txt: | deps
	@echo "ember: configuring $(BUILD) (cmake)"
	@cmake -S . -B $(BUILD) $(CMAKE_FLAGS) > /dev/null

configure: $(BUILD)/CMakeCache.txt

build: configure
	cmake --build $(BUILD) -j $(JOBS)

# The project's own small model (models/, trained on WordNet: models/README.md), served and asked one
# question. Builds only the ember program (not the tests), quietly: the build's output goes to a log
# shown on failure.
RUN_MODEL ?= models/ember-wordnet-21m.Q4_K_M.gguf
run: configure
	@echo "ember: building $(BUILD)/ember (log: $(BUILD)/build-ember.log)"
	@cmake --build $(BUILD) -j $(JOBS) --target ember > $(BUILD)/build-ember.log 2>&1 || \
		{ tail -n 40 $(BUILD)/build-ember.log; echo "ember: the build failed (log: $(BUILD)/build-ember.log)"; exit 1; }
	@tools/run_demo.sh $(BUILD)/ember $(RUN_MODEL)

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# libFuzzer targets, built with clang into build-fuzz/. Run one with e.g.
#   build-fuzz/fuzz/fuzz_gguf fuzz/corpus/gguf -max_total_time=600
fuzz: deps
	CC=clang cmake -S . -B build-fuzz -DEM_FUZZ=ON -DEM_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo
	cmake --build build-fuzz -j $(JOBS) --target fuzzers

clean:
	rm -rf $(BUILD) build-fuzz build-sanitize
