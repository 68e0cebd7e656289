"""Byte-compiled PySpark archives: same modules, bytecode used by Spark's Python processes.

``cdc_lake.pyspark_zip`` rewrites Spark's ``python/lib`` zips with ``.pyc`` entries (setup runs
it). Checked here on a made-up archive (entries kept, bytecode imported, foreign bytecode
ignored, idempotent) and on the real installation: a Python worker Spark starts imports
PySpark from bytecode in the archive.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from cdc_lake import pyspark_zip

MODULES = {
    "pkg/__init__.py": "VALUE = 41\n",
    "pkg/mod.py": "from pkg import VALUE\n\ndef answer():\n    return VALUE + 1\n",
    "pkg/broken.py": "def (:\n",  # does not compile: stays source only
    "pkg/data.txt": "not python\n",
}


def _archive(path: Path) -> Path:
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for name, text in MODULES.items():
            z.writestr(zipfile.ZipInfo(name, date_time=(2024, 5, 6, 7, 8, 10)), text)
    return path


def _import_from(archive: Path, code: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(archive), "PYTHONDONTWRITEBYTECODE": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         cwd=archive.parent)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_compiled_archive_keeps_every_entry_and_is_imported_from_bytecode(tmp_path: Path) -> None:
    archive = _archive(tmp_path / "pyspark.zip")
    before = {i.filename: zipfile.ZipFile(archive).read(i) for i in zipfile.ZipFile(archive).infolist()}
    assert not pyspark_zip.is_compiled(archive)

    compiled, failed = pyspark_zip.compile_archive(archive)

    assert (compiled, failed) == (2, ["pkg/broken.py"])
    with zipfile.ZipFile(archive) as z:
        names = set(z.namelist())
        assert {n: z.read(n) for n in before} == before  # originals byte for byte
        assert names - set(before) == {"pkg/__init__.pyc", "pkg/mod.pyc"}
        assert z.read("pkg/mod.pyc")[:4] == pyspark_zip.MAGIC
    assert pyspark_zip.is_compiled(archive)
    got = _import_from(archive, "import pkg.mod as m; print(m.answer(), m.__file__)")
    assert got == f"42 {archive}{os.sep}pkg{os.sep}mod.pyc"

    # idempotent: a second run of the command changes nothing
    stamp = archive.read_bytes()
    (tmp_path / "python" / "lib").mkdir(parents=True)
    archive.rename(tmp_path / "python" / "lib" / "pyspark.zip")
    assert pyspark_zip.main(["--spark-home", str(tmp_path), "--check"]) == 0
    assert pyspark_zip.main(["--spark-home", str(tmp_path)]) == 0
    assert (tmp_path / "python" / "lib" / "pyspark.zip").read_bytes() == stamp


def test_bytecode_of_another_python_falls_back_to_the_source(tmp_path: Path) -> None:
    archive = _archive(tmp_path / "pyspark.zip")
    pyspark_zip.compile_archive(archive)
    rewritten = tmp_path / "other.zip"
    with zipfile.ZipFile(archive) as src, zipfile.ZipFile(rewritten, "w") as dst:
        for info in src.infolist():
            data = src.read(info)
            if info.filename.endswith(".pyc"):
                data = b"\x00\x00\r\n" + data[4:]  # a magic number no Python uses
            dst.writestr(info, data)
    got = _import_from(rewritten, "import pkg.mod as m; print(m.answer(), m.__file__)")
    assert got == f"42 {rewritten}{os.sep}pkg{os.sep}mod.py"


def test_check_fails_on_a_plain_archive_and_names_the_command(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "python" / "lib").mkdir(parents=True)
    _archive(tmp_path / "python" / "lib" / "pyspark.zip")
    assert pyspark_zip.main(["--spark-home", str(tmp_path), "--check"]) == 1
    assert "python -m cdc_lake.pyspark_zip --spark-home" in capsys.readouterr().out
    assert pyspark_zip.main(["--spark-home", str(tmp_path / "nowhere")]) == 2


def test_spark_python_workers_import_pyspark_from_bytecode(spark) -> None:  # type: ignore[no-untyped-def]
    """What setup promises: Spark's own Python processes load PySpark from compiled entries."""
    home = pyspark_zip.default_spark_home()
    if not pyspark_zip.archives(home):
        pytest.skip(f"no pyspark.zip under {home}/python/lib")
    assert all(pyspark_zip.is_compiled(a) for a in pyspark_zip.archives(home)), \
        "the pyspark archives are not byte-compiled: run scripts/bootstrap.sh (make setup)"

    def where(_: object) -> str:
        import pyspark.sql.types as t

        return t.__file__

    files = spark.sparkContext.parallelize([0], 1).map(where).collect()
    assert files[0].endswith(os.path.join("pyspark.zip", "pyspark", "sql", "types.pyc")), files


_BYTECODE_CHECK = r'''
import importlib.util, json, os, struct, sys
import pandas, pyarrow, deltalake, yaml  # noqa: F401  (pandas: PySpark imports it for a SparkContext)
import cdc_lake.cdc.job, cdc_lake.enrich.job, cdc_lake.airflow.operator  # noqa: F401
stale, ok = [], 0
for m in list(sys.modules.values()):
    src = getattr(m, "__file__", None) or ""
    if not src.endswith(".py") or not src.startswith(tuple(sys.argv[1:])):
        continue
    pyc = importlib.util.cache_from_source(src)
    try:
        with open(pyc, "rb") as f:
            head = f.read(16)
        flags, mtime, size = struct.unpack("<III", head[4:16])
        good = head[:4] == importlib.util.MAGIC_NUMBER and (flags != 0 or (
            mtime == int(os.stat(src).st_mtime) & 0xFFFFFFFF and size == os.stat(src).st_size & 0xFFFFFFFF))
    except OSError:
        good = False
    if good:
        ok += 1
    else:
        stale.append(src)
print(json.dumps({"ok": ok, "stale": stale}))
'''


def test_installed_packages_are_imported_from_bytecode() -> None:
    """Setup byte-compiles .venv (scripts/bootstrap.sh): where PYTHONDONTWRITEBYTECODE
    is set (the CI machines) Python never writes bytecode itself, and every job, task and worker
    process would compile pandas, Airflow and the rest from source again (~2 s for pandas)."""
    import json
    import site

    roots = site.getsitepackages()  # (src/ is compiled on every bootstrap, then edited at will)
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    out = subprocess.run([sys.executable, "-c", _BYTECODE_CHECK, *roots], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["ok"] > 300, res
    assert not res["stale"], (f"{len(res['stale'])} imported modules have no valid bytecode, e.g. "
                              f"{res['stale'][:5]}: rm .venv/.cdc-bytecode && make setup (compiles .venv again)")
