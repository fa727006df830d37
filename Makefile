# The README's commands. Each installs missing Debian packages first (as root).
JOBS ?= $(shell nproc)

.PHONY: test demo deps build clean

deps:
	@scripts/install-deps.sh

build: deps
	cmake --preset release
	cmake --build --preset release -j $(JOBS)

# Every test in a Release build, then again under AddressSanitizer + UndefinedBehaviorSanitizer.
test: build
	ctest --preset release -j $(JOBS)
	cmake --preset asan
	cmake --build --preset asan -j $(JOBS)
	ctest --preset asan -j $(JOBS)

demo: deps
	cmake --preset release
	cmake --build --preset release -j $(JOBS) --target npullm_demo npullm_rerank
	./build/release/examples/npullm_demo
	./build/release/examples/npullm_rerank

clean:
	rm -rf build
