"""Ship the ``cdc_lake`` package to Spark executors: one zip for ``spark-submit --py-files``.

``local[*]`` hides it, a cluster does not: whatever runs in executor Python workers (the
change-feed source's ``read()``, any Python the jobs push down) imports ``cdc_lake`` there, and
the executors' Python must not depend on what happens to be installed on each worker. The
operators therefore ship the exact code the driver runs, built from the installed package::

    zip_path = package_zip()            # ~/.cache/cdc-lake/py-files/cdc_lake-0.1.0-<hash>.zip
    spark-submit --py-files <zip_path> spark_jobs/cdc_ingest.py ...

The zip holds the ``cdc_lake`` package only (``*.py`` files, no caches); its name carries a hash
of the content, so a changed package gets a new file and concurrent builders never write the
same file half-way (write to a temp file, then rename). Third-party libraries (pyspark's own
zip comes from Spark; ``deltalake``/``pyarrow`` for the change-feed source) must be in the
executors' Python — a cluster image or ``spark.archives`` with a packed venv (README, "Running
on a cluster").
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import zipfile
from pathlib import Path

import cdc_lake

CACHE_ENV = "CDC_PY_FILES_DIR"
_FIXED_TIME = (2020, 1, 1, 0, 0, 0)  # reproducible zips: same content -> same bytes


def package_root() -> Path:
    """The folder of the ``cdc_lake`` package the driver imports."""
    return Path(cdc_lake.__file__).resolve().parent


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def package_zip(dest: str | os.PathLike[str] | None = None) -> Path:
    """Build (or reuse) the zip of the ``cdc_lake`` package; returns its path.

    ``dest``: folder for the zip; default ``$CDC_PY_FILES_DIR``, else
    ``~/.cache/cdc-lake/py-files``. Idempotent and safe to call from concurrent tasks.
    """
    root = package_root()
    files = _files(root)
    digest = hashlib.sha256()
    for f in files:
        digest.update(str(f.relative_to(root.parent)).encode())
        digest.update(b"\0")
        digest.update(f.read_bytes())
        digest.update(b"\0")
    folder = Path(dest or os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "cdc-lake" / "py-files")
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"cdc_lake-{cdc_lake.__version__}-{digest.hexdigest()[:16]}.zip"
    if target.is_file():
        return target
    fd, tmp = tempfile.mkstemp(prefix=".cdc_lake-", suffix=".zip.tmp", dir=folder)
    os.close(fd)
    try:
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as z:
            for f in files:
                info = zipfile.ZipInfo(str(f.relative_to(root.parent)), date_time=_FIXED_TIME)
                info.external_attr = 0o644 << 16
                info.compress_type = zipfile.ZIP_DEFLATED
                z.writestr(info, f.read_bytes())
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def main(argv: list[str] | None = None) -> int:
    """``python -m cdc_lake.packaging [--dest DIR]``: build (or reuse) the zip, print its path.

    For spark-submit by hand on a cluster, as the operators do it (client mode)::

        ZIP=$(.venv/bin/python -m cdc_lake.packaging)
        PYTHONPATH="$ZIP" .venv/bin/spark-submit --master spark://HOST:7077 --py-files "$ZIP" \\
            spark_jobs/enrich.py --pipeline pipelines/shop_order_lines.yaml
    """
    import argparse

    p = argparse.ArgumentParser(prog="python -m cdc_lake.packaging",
                                description="Zip the cdc_lake package for spark-submit --py-files "
                                            "and print the zip's path.")
    p.add_argument("--dest", default=None, help=f"folder for the zip (default ${CACHE_ENV}, else "
                                                "~/.cache/cdc-lake/py-files)")
    print(package_zip(p.parse_args(argv).dest))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
