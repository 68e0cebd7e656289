#!/usr/bin/env bash
# Set up everything the project needs on a fresh machine: checks Python 3.11 and Java 17,
# creates .venv and installs the pinned dependencies (constraints.txt) plus this package.
# Idempotent: a second run only re-checks. Usage: scripts/bootstrap.sh
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
if ! "$PY" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else 1)'; then
  echo "ERROR: Python 3.11 is required (found: $("$PY" --version 2>&1)). Install python3.11 and retry," >&2
  echo "       or point PYTHON=/path/to/python3.11." >&2
  exit 1
fi

if ! command -v java >/dev/null 2>&1; then
  echo "ERROR: Java is not installed; Spark 4 needs Java 17 (or 21)." >&2
  echo "       Debian/Ubuntu: apt-get install -y openjdk-17-jre-headless ; macOS: brew install openjdk@17" >&2
  exit 1
fi
JAVA_MAJOR=$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1)
if [ -z "$JAVA_MAJOR" ] || [ "$JAVA_MAJOR" -lt 17 ]; then
  echo "ERROR: Spark 4 needs Java 17 or newer; found Java ${JAVA_MAJOR:-unknown} ($(command -v java))." >&2
  echo "       Install openjdk-17 and put it first on PATH (or set JAVA_HOME)." >&2
  exit 1
fi

STAMP=.venv/.cdc-installed
UV_PIN="uv==0.13.9"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
if [ ! -f "$STAMP" ] || [ constraints.txt -nt "$STAMP" ] || [ pyproject.toml -nt "$STAMP" ]; then
  echo "[bootstrap] installing pinned dependencies into .venv (first run takes a few minutes)"
  # uv (pinned, PyPI) installs the same pinned set as pip from constraints.txt in about 30 s
  # instead of 75 s with warm caches (measured 2026-11-28; identical `pip freeze`). pip stays in
  # the venv and is the fallback where no uv wheel exists. System CA certificates are trusted
  # (pip's default), for networks with their own TLS proxy.
  if .venv/bin/python -m pip install --quiet "$UV_PIN" 2>/dev/null && [ -x .venv/bin/uv ] &&
     .venv/bin/uv pip install --quiet --system-certs -p .venv/bin/python -c constraints.txt -e ".[dev]"; then
    :
  else
    echo "[bootstrap] uv unavailable or its install failed here; installing with pip"
    .venv/bin/python -m pip install --quiet --upgrade "pip>=24"
    .venv/bin/python -m pip install --quiet -c constraints.txt -e ".[dev]"
  fi
  touch "$STAMP"
fi
# Bytecode for every installed module and this package (uv installs none, and where
# PYTHONDONTWRITEBYTECODE is set - as on the CI machines - Python never writes it): without it
# every process (spark-submit driver, Airflow task, test worker) compiles what it imports from
# source again, e.g. ~2 s for pandas, which PySpark imports while creating a SparkContext
# (measured 2026-11-29: a read+count spark-submit 8.4 -> 6.1 s). .venv once per install (~20 s;
# a file that does not compile, e.g. a template shipped in a package, is never imported), src/
# on every run (what changed since).
BYTECODE_STAMP=.venv/.cdc-bytecode
if [ ! -f "$BYTECODE_STAMP" ] || [ "$STAMP" -nt "$BYTECODE_STAMP" ]; then
  echo "[bootstrap] compiling the bytecode of .venv"
  .venv/bin/python -m compileall -q -j 0 .venv/lib/python3.11/site-packages > .venv/compileall.log 2>&1 ||
    echo "[bootstrap] compileall: some files did not compile (.venv/compileall.log); the rest has bytecode"
  touch "$BYTECODE_STAMP"
fi
.venv/bin/python -m compileall -q src || echo "[bootstrap] src/: a module above did not compile"
# Spark puts pyspark.zip first on every Python process's path (driver, Python data source
# runners, workers); with bytecode inside, each starts ~0.3 s sooner (cdc_lake/pyspark_zip.py).
# Idempotent; a pyspark reinstall brings back the plain zip and this puts the bytecode back.
.venv/bin/python -m cdc_lake.pyspark_zip | sed 's/^/[bootstrap] /'
# The driver JVM's class-data-sharing archive (cdc_lake/jvm_archive.py): Spark's classes mapped
# from one file instead of loaded and verified on every run (a small run ~3 s sooner). Built once
# by a ~40 s training run of each job kind (CDC, dimension, enrichment) in one JVM, again when
# pyspark or java change or the archive predates a job kind; CDC_JVM_ARCHIVE=off skips it.
# A failed build is reported and the runs start without an archive.
.venv/bin/python -m cdc_lake.jvm_archive ensure 2>&1 | sed 's/^/[bootstrap] /' || true
echo "[bootstrap] ready: $(.venv/bin/python --version), Java $JAVA_MAJOR, $(.venv/bin/python -c 'import pyspark, deltalake, airflow; print(f"pyspark {pyspark.__version__}, deltalake {deltalake.__version__}, airflow {airflow.__version__}")')"
