# Two commands set up a fresh machine: `make demo` and `make test`.
# Both install what is missing (scripts/install-deps.sh), build, then run.

BUILD_DIR ?= build
JOBS ?= 2
BUILD_TYPE ?= Release
PYTHON := $(CURDIR)/.venv/bin/python

.PHONY: all deps configure build demo test docs clean

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

clean:
	rm -rf $(BUILD_DIR)
