# Ember's two commands: `make run` and `make test`. `make` alone builds build/ember.
BUILD ?= build
JOBS ?= 2
CMAKE_FLAGS ?=

# The CUDA backend. `make` and `make test` build it wherever nvcc is found (so CI compiles the CUDA
# code); `make run` builds it only where a GPU is present (nvidia-smi lists one, or /dev/nvidia0
# exists): on a machine with nvcc and no GPU, compiling the kernels was most of a first run's time,
# for a backend it cannot use. EMBER_CUDA=1 or EMBER_CUDA=0 decides for every target.
gpu_present = $(shell { nvidia-smi -L 2>/dev/null | grep -q '^GPU' || [ -e /dev/nvidia0 ]; } && echo 1 || echo 0)
cuda_choice = $(if $(filter 0 1,$(EMBER_CUDA)),$(EMBER_CUDA),$(1))
on_off = $(if $(filter 1,$(1)),ON,OFF)

.PHONY: all deps configure configure-run build run test fuzz clean

all: build

deps:
	@tools/deps.sh

# Configuring runs after deps has finished (a prerequisite of the recipe, so `make -j` keeps the
# order: cmake fails on a package not installed yet), and again only when BUILD has no cache or was
# configured with the other CUDA choice (the cache keeps EM_CUDA, so the choice is compared with it).
# $(1): ON or OFF; $(2): why, for the line it prints.
define configure_with_cuda
	@have=$$(sed -n 's/^EM_CUDA:BOOL=//p' $(BUILD)/CMakeCache.txt 2>/dev/null); \
	if [ "$$have" != "$(1)" ]; then \
	  echo "ember: configuring $(BUILD) (cmake, EM_CUDA=$(1)$(2))"; \
	  cmake -S . -B $(BUILD) -DEM_CUDA=$(1) $(CMAKE_FLAGS) > /dev/null || exit 1; \
	fi
endef

configure: deps
	$(call configure_with_cuda,$(call on_off,$(call cuda_choice,1)))

configure-run: deps
	$(call configure_with_cuda,$(call on_off,$(call cuda_choice,$(gpu_present))),$(if $(filter 0 1,$(EMBER_CUDA)),,$(if $(filter 1,$(gpu_present)),: a GPU is present,: no GPU here; EMBER_CUDA=1 builds the CUDA backend)))

build: configure
	cmake --build $(BUILD) -j $(JOBS)

# The project's own small model (models/, trained on WordNet: models/README.md), served and asked one
# question. Builds only the ember program (not the tests), quietly: the build's output goes to a log
# shown on failure.
RUN_MODEL ?= models/ember-wordnet-21m.Q4_K_M.gguf
run: configure-run
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
