# Two commands: `make demo` runs the retraining DAG end to end; `make test` runs the whole suite.
# `make unit` is the fast layer: unit tests and DAG integrity, no servers, under a minute.
# Everything runs inside a loopback-only network namespace (scripts/loopback.sh); all state is in .state/.
# Python entry points run as modules from the repository root, where devstack/, include/, scripts/,
# tests/ and bench/ are importable (emr_ray itself comes from the editable install).
.PHONY: setup demo test unit lint clean airflow

LINT_PATHS = plugins dags include tests scripts bench devstack

setup:
	@bash scripts/setup.sh

demo: setup
	@bash scripts/loopback.sh .venv/bin/python -m scripts.demo $(ARGS)

test: setup lint
	@bash scripts/loopback.sh .venv/bin/python -m pytest $(PYTEST_ARGS)

# its own state folder, so it can run while `make test` runs
unit: setup
	@EMR_RAY_TEST_STATE=$(CURDIR)/.state/unit bash scripts/loopback.sh \
		.venv/bin/python -m pytest tests/unit tests/dags bench/checks $(PYTEST_ARGS)

lint: setup
	@.venv/bin/ruff check $(LINT_PATHS)
	@.venv/bin/ruff format --check $(LINT_PATHS)
	@.venv/bin/mypy plugins/emr_ray

# EXECUTOR=celery: the CeleryExecutor (Redis broker, two Celery workers) instead of the LocalExecutor
airflow: setup
	@EXECUTOR=$(EXECUTOR) bash scripts/airflow.sh

clean:
	rm -rf .state
