# Two commands set up a fresh machine: `make demo` and `make test`.
# Both install what is missing (scripts/install-deps.sh), build, then run.

BUILD_DIR ?= build
JOBS ?= 2
BUILD_TYPE ?= Release
PYTHON := $(CURDIR)/.venv/bin/python

.PHONY: all deps configure build demo test test-gpu test-oldest-torch docs clean portable-tools runtime

all: build

deps:
	@scripts/install-deps.sh

configure: deps
	@if [ ! -f $(BUILD_DIR)/build.ninja ]; then \
	  cmake -G Ninja -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) \
	    -DFSDP_PYTHON=$(PYTHON); \
	fi

build: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS)

demo: build
	@scripts/demo.sh $(BUILD_DIR)

test: build
	@cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS)

# Regenerates the dialect and pass manuals from the ODS descriptions.
docs: build
	@cp $(BUILD_DIR)/docs/fsdp/FsdpDialect.md $(BUILD_DIR)/docs/fsdp/FsdpPasses.md docs/dialect/
	@echo "docs/dialect/FsdpDialect.md and FsdpPasses.md regenerated"

# For a GPU host without MLIR: fsdp-opt and fsdp-translate linked with LLVM's
# and MLIR's static archives (build-portable/bin), carried there with the sources.
PORTABLE_DIR ?= build-portable
portable-tools: deps
	@if [ ! -f $(PORTABLE_DIR)/build.ninja ]; then \
	  cmake -G Ninja -S . -B $(PORTABLE_DIR) -DCMAKE_BUILD_TYPE=Release -DFSDP_PYTHON=$(PYTHON) \
	    -DFSDP_LINK_MLIR_DYLIB=OFF -DFSDP_PORTABLE_TOOLS=ON; \
	fi
	@cmake --build $(PORTABLE_DIR) -j $(JOBS) --target fsdp-opt fsdp-translate
	@strip $(PORTABLE_DIR)/bin/fsdp-opt $(PORTABLE_DIR)/bin/fsdp-translate
	@scripts/check-portable.sh $(PORTABLE_DIR)/bin/fsdp-opt $(PORTABLE_DIR)/bin/fsdp-translate
	@scripts/compiler-digest.sh > $(PORTABLE_DIR)/bin/sources.sha256

# On the GPU host: the runtime and its extension against the installed torch
# (CUDA and NCCL come with it), without MLIR, the carried portable compiler
# next to them in $(BUILD_DIR)/bin, where fsdpc looks first, and fsdpc
# installed in place into RUNTIME_PYTHON, the interpreter that has torch
# (scripts/install-in-place.py: a .pth file, no network or build tools).
RUNTIME_PYTHON ?= python3
runtime:
	@cmake -G Ninja -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=Release -DFSDP_RUNTIME_ONLY=ON \
	  -DFSDP_PYTHON=$$(command -v $(RUNTIME_PYTHON))
	@cmake --build $(BUILD_DIR) -j $(JOBS)
	@if [ -x $(PORTABLE_DIR)/bin/fsdp-opt ]; then \
	  mkdir -p $(BUILD_DIR)/bin && cp $(PORTABLE_DIR)/bin/fsdp-opt $(PORTABLE_DIR)/bin/fsdp-translate $(BUILD_DIR)/bin/; \
	fi
	@$(RUNTIME_PYTHON) scripts/install-in-place.py

# fsdpc.shard on the GPU (python/tests/test_gpu.py), CUDA-target capture and the
# generated kernels (launched on the GPU, compiled with NVRTC, checked on the host);
# where there is no GPU, pytest says so and skips them.
TEST_PYTHON ?= $(if $(wildcard .venv/bin/python),$(PYTHON),$(RUNTIME_PYTHON))
test-gpu:
	@cd python/tests && PYTHONPATH=$(CURDIR)/python $(TEST_PYTHON) -m pytest -q -rs -p no:cacheprovider \
	  test_gpu.py test_cuda_capture.py test_pointwise_kernels.py

# The Python suite against the oldest supported torch (the GPU hosts' 2.11),
# in a venv and a runtime build of its own; CI's .venv has the newest.
test-oldest-torch: build
	@JOBS=$(JOBS) scripts/test-oldest-torch.sh

clean:
	rm -rf $(BUILD_DIR) $(PORTABLE_DIR) build-oldest
