.PHONY: run test test-fast lint

run:  ## install, migrate, seed the demo and run the control plane
	scripts/run

test:  ## install test dependencies and run the whole suite
	scripts/test

test-fast:  ## the suite without tests that start processes or a browser
	scripts/test -m "not slow"

lint:
	scripts/bootstrap test,dev
	.venv/bin/ruff check . && .venv/bin/ruff format --check . && .venv/bin/mypy controlplane registry regions billing
