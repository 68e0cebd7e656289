# Two commands on a fresh machine:  make demo   |   make test
.PHONY: setup demo test test-slow test-all airflow airflow-stop bench bench-quick lint clean

setup:
	scripts/bootstrap.sh

demo:
	scripts/demo.sh

test:
	scripts/test.sh

test-slow:
	CDC_SLOW=1 scripts/test.sh

airflow:
	scripts/bootstrap.sh && scripts/airflow_local.sh start

airflow-stop:
	scripts/airflow_local.sh stop

bench:
	scripts/bootstrap.sh && .venv/bin/python benchmarks/bench.py

bench-quick:
	scripts/bootstrap.sh && .venv/bin/python benchmarks/bench.py --quick

clean:
	rm -rf data var test-artifacts .pytest_cache
