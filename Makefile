.PHONY: run test test-fast test-unit lint smoke

run:  ## install, migrate, seed the demo and run the control plane
	scripts/run

test:  ## install test dependencies and run the whole suite
	scripts/test

test-fast:  ## the suite without tests that start processes or a browser
	scripts/test -m "not slow"

test-unit:  ## in seconds: the tests that need no database, server, process or browser
	scripts/test -m unit

lint:  ## ruff, mypy, import contracts and circles (scripts/structure), deptry
	scripts/bootstrap test,dev
	.venv/bin/ruff check . && .venv/bin/ruff format --check . \
	  && .venv/bin/mypy controlplane core registry regions artifacts billing routing rollouts autoscaling gateway \
	  && .venv/bin/lint-imports && .venv/bin/python scripts/structure --check \
	  && .venv/bin/deptry .

smoke:  ## the README's quick start on a fresh clone of HEAD: dashboard and gateway answer, Ctrl-C stops all
	scripts/smoke
