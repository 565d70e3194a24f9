# Ember's two commands: `make run` and `make test`. `make` alone builds build/ember.
BUILD ?= build
JOBS ?= 2
CMAKE_FLAGS ?=
FIXTURES ?= $(abspath tests/fixtures/reference)

.PHONY: all deps configure build run test fuzz clean

all: build

deps:
	@tools/deps.sh

$(BUILD)/CMakeCache.txt:
	@echo "ember: configuring $(BUILD) (cmake)"
	@cmake -S . -B $(BUILD) $(CMAKE_FLAGS) > /dev/null

configure: deps $(BUILD)/CMakeCache.txt

build: configure
	cmake --build $(BUILD) -j $(JOBS)

# A tiny model with random weights (synthesized once), then a short generation with it. Builds only
# the ember program (not the tests), quietly: the build's output goes to a log shown on failure.
RUN_MODEL ?= $(BUILD)/tiny-llama-q8_0.gguf
run: configure
	@echo "ember: building $(BUILD)/ember (log: $(BUILD)/build-ember.log)"
	@cmake --build $(BUILD) -j $(JOBS) --target ember > $(BUILD)/build-ember.log 2>&1 || \
		{ tail -n 40 $(BUILD)/build-ember.log; echo "ember: the build failed (log: $(BUILD)/build-ember.log)"; exit 1; }
	@test -f $(RUN_MODEL) || $(BUILD)/ember synth --preset tiny-llama --type q8_0 -o $(RUN_MODEL) \
		--vocab $(FIXTURES)/vocab/ggml-vocab-llama-spm.gguf
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
