# Two commands: `make demo` runs the retraining DAG end to end; `make test` runs the whole suite.
# Everything runs inside a loopback-only network namespace (scripts/loopback.sh); all state is in .state/.
.PHONY: setup demo test lint clean airflow

setup:
	@bash scripts/setup.sh

demo: setup
	@bash scripts/loopback.sh .venv/bin/python scripts/demo.py $(ARGS)

test: setup lint
	@bash scripts/loopback.sh .venv/bin/python -m pytest $(PYTEST_ARGS)

lint: setup
	@.venv/bin/ruff check plugins dags include tests scripts bench
	@.venv/bin/ruff format --check plugins dags include tests scripts bench
	@.venv/bin/mypy plugins/emr_ray

airflow: setup
	@bash scripts/airflow.sh

clean:
	rm -rf .state
