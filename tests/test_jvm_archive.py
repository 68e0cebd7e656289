"""The driver JVM's class-data-sharing archive: handed to a run only when complete and current,
and then really used by the JVM spark-submit starts.

The guard matters: the JDK 17 here crashes (SIGBUS) on a truncated archive instead of ignoring
it, so :func:`cdc_lake.jvm_archive.option` must refuse anything whose size or build inputs do
not match its manifest. The last test runs a real spark-submit with the product's launch
options and reads the JVM's own class-loading log.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cdc_lake import jvm_archive
from cdc_lake.launch import C1_ONLY, DRIVER_JAVA_OPTIONS, class_archive, driver_jit, launch_conf


def _fake(path: Path, size: int, **fingerprint: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\0" * size)
    manifest = {"size": size, "fingerprint": {**jvm_archive.fingerprint(), **fingerprint}}
    path.with_name(path.name + ".json").write_text(json.dumps(manifest))


def test_option_only_for_a_complete_archive_of_this_environment(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "a" / "spark-driver.jsa"
    monkeypatch.setenv(jvm_archive.ENV, str(path))
    assert jvm_archive.option() is None  # nothing built

    _fake(path, 4096)
    assert jvm_archive.option() == f"-XX:SharedArchiveFile={path}"

    with open(path, "r+b") as f:  # truncated (the JVM would crash on it)
        f.truncate(1000)
    assert jvm_archive.option() is None

    _fake(path, 4096, pyspark="3.5.0")  # built for another pyspark
    assert jvm_archive.option() is None
    _fake(path, 4096, java="/opt/other-jdk/bin/java")  # ... or another java
    assert jvm_archive.option() is None

    _fake(path, 4096)
    path.with_name(path.name + ".json").write_text("{not json")  # damaged manifest
    assert jvm_archive.option() is None

    _fake(path, 4096)
    jvm_archive.remove(path)
    assert not path.exists() and jvm_archive.option() is None

    _fake(path, 4096)
    monkeypatch.setenv(jvm_archive.ENV, "off")
    assert jvm_archive.archive_path() is None and jvm_archive.option() is None


def test_launch_options_carry_the_archive_with_either_jit() -> None:
    opt = "-XX:SharedArchiveFile=/x/spark-driver.jsa"
    small = launch_conf(None, archive=opt)[DRIVER_JAVA_OPTIONS]
    big = launch_conf(400 * 2**20, archive=opt)[DRIVER_JAVA_OPTIONS]
    assert (driver_jit(small), class_archive(small)) == ("C1", "/x/spark-driver.jsa")
    assert (driver_jit(big), class_archive(big)) == ("C1+C2", "/x/spark-driver.jsa")
    assert launch_conf(None) == {DRIVER_JAVA_OPTIONS: C1_ONLY}  # no archive: as before
    assert launch_conf(400 * 2**20) == {}


def test_the_c1_only_driver_keeps_the_tiered_code_cache() -> None:
    """C1 alone gets a 48 MiB code cache, and a full one switches the JIT off for the rest of
    the JVM's life (a warm session of the old options: an events run 6 -> 16 s); the C1 option
    set reserves the tiered JIT's 240 MiB. Asked of the JVM itself (its final flag values)."""
    import shutil

    java = shutil.which("java", path=os.path.join(os.environ.get("JAVA_HOME", ""), "bin")) or "java"

    def flags(*opts: str) -> dict[str, str]:
        out = subprocess.run([java, *opts, "-XX:+PrintFlagsFinal", "-version"], capture_output=True,
                             text=True, timeout=60).stdout
        return {p[1]: p[3] for p in (ln.split() for ln in out.splitlines()) if len(p) >= 4}

    assert int(flags("-XX:TieredStopAtLevel=1")["ReservedCodeCacheSize"]) == 48 * 2**20  # the trap
    c1 = flags(*C1_ONLY.split())
    assert c1["TieredStopAtLevel"] == "1" and int(c1["ReservedCodeCacheSize"]) >= 240 * 2**20, c1


def test_spark_submit_maps_sparks_classes_from_the_built_archive(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """make setup built it (bootstrap); a spark-submit with the product's launch options loads
    Spark's classes from it, as the JVM's class-loading log says."""
    opt = jvm_archive.option()
    assert opt is not None, ("no usable JVM class archive for this environment: run "
                             "scripts/bootstrap.sh (make setup) or python -m cdc_lake.jvm_archive build")
    log = tmp_path / "classload.txt"
    options = launch_conf(None, archive=opt)[DRIVER_JAVA_OPTIONS] + f" -Xlog:class+load=info:file={log}"
    script = tmp_path / "count.py"
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"id": [1, 2, 3]}), tmp_path / "t.parquet")
    script.write_text("from pyspark.sql import SparkSession\n"
                      "s = SparkSession.builder.getOrCreate()\nprint('ROWS', s.range(5).count())\n"
                      f"print('PARQUET', s.read.parquet({str(tmp_path / 't.parquet')!r}).count())\ns.stop()\n")
    bindir = Path(sys.executable).parent
    out = subprocess.run([str(bindir / "spark-submit"), "--master", "local[1]",
                          "--conf", f"{DRIVER_JAVA_OPTIONS}={options}", "--conf", "spark.ui.enabled=false",
                          str(script)], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"})
    assert out.returncode == 0 and "ROWS 5" in out.stdout, out.stderr[-3000:]
    lines = log.read_text().splitlines()
    spark_classes = [ln for ln in lines if " org.apache.spark." in ln]
    shared = [ln for ln in spark_classes if "shared objects file (top)" in ln]
    assert len(shared) > 1000, f"{len(shared)} of {len(spark_classes)} Spark classes from the archive"
    # the training ran the dimension and enrichment kinds too, which read Delta tables with Spark's
    # Parquet scan (the CDC kind alone never loads it): those classes are archived as well
    assert "PARQUET 3" in out.stdout, out.stderr[-3000:]
    parquet = [ln for ln in lines if " org.apache.parquet." in ln]
    from_archive = [ln for ln in parquet if "shared objects file (top)" in ln]
    assert parquet and len(from_archive) > 0.9 * len(parquet), (
        f"{len(from_archive)} of {len(parquet)} Parquet classes from the archive "
        f"(trained on {jvm_archive._trained_on(Path(opt.split('=', 1)[1]))})")


@pytest.mark.parametrize("missing", ["manifest", "archive"])
def test_status_reports_an_unusable_archive(tmp_path, monkeypatch, capsys, missing) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "spark-driver.jsa"
    monkeypatch.setenv(jvm_archive.ENV, str(path))
    _fake(path, 64)
    (path.with_name(path.name + ".json") if missing == "manifest" else path).unlink()
    assert jvm_archive.main(["status"]) == 1
    assert "not usable" in capsys.readouterr().out


def test_ensure_rebuilds_an_archive_trained_on_fewer_job_kinds(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """An archive from an older setup (CDC training only, no ``trained_on``) still works, but
    ``make setup`` (ensure) replaces it; a current one is left alone. The decision only: the
    build itself is the bootstrap's real training run, exercised by the test above."""
    path = tmp_path / "spark-driver.jsa"
    monkeypatch.setenv(jvm_archive.ENV, str(path))
    built: list[Path] = []
    monkeypatch.setattr(jvm_archive, "build", lambda p, **_: built.append(p) or {"size": 1 << 20, "training_s": 1})
    _fake(path, 4096)  # usable, trained_on unknown
    assert jvm_archive.option() is not None
    assert jvm_archive.main(["ensure"]) == 0 and built == [path]
    manifest = path.with_name(path.name + ".json")
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "trained_on": jvm_archive.TRAINED_ON}))
    assert jvm_archive.main(["ensure"]) == 0 and built == [path]  # up to date: no second build
