"""Class-data-sharing archive for the driver JVM: Spark's classes mapped from one file at start.

A scheduled run's driver JVM loads and verifies the same several thousand Spark classes every
time (about 3 s of a small run here). The JDK's dynamic AppCDS archive (JEP 350) stores them once:
a training run ends with ``-XX:ArchiveClassesAtExit=<file>``, later JVMs start with
``-XX:SharedArchiveFile=<file>`` and map the classes instead. ``make setup`` builds it from
a tiny run of each job kind (CDC, dimension, enrichment) on the demo shop in one JVM (≈ 45 s);
the launch options of every run then carry it (:func:`cdc_lake.launch.launch_conf` with
``archive=option()``)::

    python -m cdc_lake.jvm_archive build     # (re)build for this venv's pyspark and JDK
    python -m cdc_lake.jvm_archive status    # where it is, whether runs use it
    python -m cdc_lake.jvm_archive remove

Guarded, because a damaged archive is not harmless: the JDK 17 here crashes (SIGBUS) on a
truncated archive instead of ignoring it (checked). So the archive is written under a temporary
name by the JVM and renamed into place, and a manifest beside it records its size and what it was
built for (pyspark version and jars, the ``java`` spark-submit runs); :func:`option` hands the
archive to a run only when all of that still matches — otherwise the run starts without it, as
before. A JDK update in place is refused by the JVM itself (its archive header names the JVM
build) and the run starts without it. ``CDC_JVM_ARCHIVE`` overrides the path; ``off`` disables.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ENV = "CDC_JVM_ARCHIVE"
TRAINING_RUN = "jvm-archive-training"
TRAINED_ON = ["cdc", "dimension", "enrich"]  # job kinds the training runs (manifest "trained_on")
_TRAIN = '''
import sys
from pathlib import Path
from cdc_lake.cdc.job import run_pipeline
from cdc_lake.config import load_pipeline
from cdc_lake.demo import categories
from cdc_lake.dimensions.refresh import run_refresh
from cdc_lake.enrich.job import run_enrich
cdc, dim, enrich, lake, snaps = sys.argv[1:6]
# one JVM runs all three job kinds, so the archive holds the classes each of them loads
status = [run_pipeline(load_pipeline(cdc), run_id="{run}-cdc")["status"]]
lake = Path(lake)
if categories.main(["--products", str(lake / "products"), "--order-items", str(lake / "order_items"),
                    "--out", snaps, "--start", "2026-01-01"]) != 0:
    sys.exit(1)
status.append(run_refresh(load_pipeline(dim), date="2026-01-01", run_id="{run}-dimension")["status"])
status.append(run_enrich(load_pipeline(enrich), run_id="{run}-enrich")["status"])
print("TRAINING", status)
sys.exit(0 if status == ["succeeded"] * 3 else 1)
'''
# The training's dimension and enrichment pipelines: the demo's (pipelines/product_categories.yaml,
# pipelines/shop_order_lines.yaml) over the training lake, written here so that editing or removing
# the example pipelines never changes what setup trains on.
_DIMENSION_YAML = '''
kind: dimension
pipeline: jvm_archive_training_dim
snapshots: {{path: "{snaps}", format: csv, pattern: "{{date}}.csv"}}
keys: [product_id]
scd: 1
schema: {{product_id: bigint, category: string}}
table: "{root}/dims/product_categories"
'''
_ENRICH_YAML = '''
kind: enrich
pipeline: jvm_archive_training_enrich
fact: {{change_feed: "{lake}/order_items", keys: [order_id, line_no]}}
dimensions:
  orders:     {{table: "{lake}/orders", keys: [id], scd: 1, on: {{order_id: id}},
               columns: {{customer_id: customer_id, order_time: created_at}}}}
  products:   {{table: "{lake}/products", keys: [id], scd: 1, on: {{product_id: id}}, columns: {{product_name: name}}}}
  categories: {{table: "{root}/dims/product_categories", keys: [product_id], scd: 1,
               on: {{product_id: product_id}}, columns: {{category: category}}}}
  customers:  {{table: "{lake}/customers", keys: [id], scd: 2, on: {{customer_id: id}}, columns: {{customer_city: city}}}}
event_time: order_time
late_members: {{wait: 2h}}
outputs:
  enriched: "{root}/gold/order_lines"
  pending: "{root}/gold/_pending"
  quarantine: "{root}/gold/_quarantine"
  aggregates:
    revenue_by_category_day:
      path: "{root}/gold/revenue_by_category_day"
      group_by: [category]
      time_bucket: day
      sums: {{revenue: "qty * unit_price", units: "qty"}}
'''


def archive_path() -> Path | None:
    """Where this environment's archive lives (None: disabled with ``CDC_JVM_ARCHIVE=off``)."""
    env = os.environ.get(ENV, "").strip()
    if env.lower() in ("off", "0", "false", "no"):
        return None
    return Path(env) if env else Path(sys.prefix) / "share" / "cdc-lake" / "spark-driver.jsa"


def _manifest_path(archive: Path) -> Path:
    return archive.with_name(archive.name + ".json")


def _java() -> str | None:
    """The java spark-submit's launcher runs: ``$JAVA_HOME/bin/java``, else ``java`` on PATH."""
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    return os.path.realpath(found) if found and os.path.exists(found) else None


def fingerprint() -> dict[str, Any]:
    """What an archive is only valid for: the pyspark (version and jars) and the java binary."""
    import pyspark

    jars = Path(pyspark.__file__).resolve().parent / "jars"
    listing = sorted(f"{p.name}:{p.stat().st_size}" for p in jars.glob("*.jar"))
    return {"pyspark": pyspark.__version__,
            "jars": hashlib.sha256("\n".join(listing).encode()).hexdigest()[:16],
            "java": _java()}


def option() -> str | None:
    """``-XX:SharedArchiveFile=<archive>`` when a complete archive for this environment exists."""
    path = archive_path()
    if path is None:
        return None
    try:
        manifest = json.loads(_manifest_path(path).read_text(encoding="utf-8"))
        size = path.stat().st_size
    except (OSError, ValueError):
        return None
    if manifest.get("size") != size or manifest.get("fingerprint") != fingerprint():
        return None
    return f"-XX:SharedArchiveFile={path}"


def _trained_on(path: Path) -> list[str] | None:
    """The job kinds the archive at ``path`` was trained on (None: unknown, an older build)."""
    try:
        return json.loads(_manifest_path(path).read_text(encoding="utf-8")).get("trained_on")
    except (OSError, ValueError, AttributeError):
        return None


def remove(path: Path) -> None:
    _manifest_path(path).unlink(missing_ok=True)  # the manifest first: never an unguarded archive
    path.unlink(missing_ok=True)


def build(path: Path, *, log: Path | None = None) -> dict[str, Any]:
    """Train on a tiny run of each job kind and install the archive at ``path``.

    One spark-submit runs, in one driver JVM: a CDC ingest of one day of the demo shop (customers
    as SCD2), a dimension refresh of the demo's product categories from a CSV export, and an
    enrichment of the order lines' change feed with orders, products, categories and customers.
    Raises RuntimeError (naming the log) when the training run fails or writes no archive; the
    previous archive, if any, is then left as it was.
    """
    from cdc_lake.demo.generator import generate
    from cdc_lake.demo.pipeline_yaml import write_pipeline_yaml

    path.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="cdc-jvm-archive-") as tmp:
        work = Path(tmp)
        generate(work / "landing", "maxwell", days=1, seed=7)
        root, lake, snaps = work / "lake", work / "lake" / "shop", work / "snapshots"
        cdc = write_pipeline_yaml(work / "pipeline.yaml", "maxwell", landing=work / "landing",
                                  lake_root=lake, name="jvm_archive_training", scd={"customers": 2})
        dim, enrich = work / "dimension.yaml", work / "enrich.yaml"
        dim.write_text(_DIMENSION_YAML.format(root=root, snaps=snaps), encoding="utf-8")
        enrich.write_text(_ENRICH_YAML.format(root=root, lake=lake), encoding="utf-8")
        script = work / "train.py"
        script.write_text(_TRAIN.format(run=TRAINING_RUN), encoding="utf-8")
        dump = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
        from cdc_lake.launch import C1_ONLY, DRIVER_JAVA_OPTIONS

        submit = str(Path(sys.executable).parent / "spark-submit")
        cmd = [submit if os.path.exists(submit) else "spark-submit", "--master", "local[2]",
               "--conf", f"{DRIVER_JAVA_OPTIONS}={C1_ONLY} -XX:ArchiveClassesAtExit={dump}",
               "--conf", f"spark.pyspark.python={sys.executable}",
               "--conf", "spark.ui.enabled=false", "--conf", "spark.sql.session.timeZone=UTC",
               str(script), str(cdc), str(dim), str(enrich), str(lake), str(snaps)]
        env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
               ENV: "off"}  # the training JVM itself starts without an archive
        log_path = log or work / "training.log"
        try:
            with open(log_path, "wb") as out:
                rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=tmp).returncode
            if rc != 0 or not dump.is_file() or dump.stat().st_size == 0:
                tail = log_path.read_text(encoding="utf-8", errors="replace")[-2000:]
                raise RuntimeError(f"the training run failed (exit {rc}) or wrote no archive; "
                                   f"log {log_path}:\n{tail}")
            size = dump.stat().st_size
            remove(path)
            os.replace(dump, path)
        finally:
            dump.unlink(missing_ok=True)
    manifest = {"size": size, "fingerprint": fingerprint(),
                "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "training_s": round(time.monotonic() - started, 1),
                "trained_on": TRAINED_ON}
    tmp_manifest = _manifest_path(path).with_name(f".{path.name}.json.tmp")
    tmp_manifest.write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    os.replace(tmp_manifest, _manifest_path(path))
    return manifest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("action", choices=["build", "status", "remove", "ensure"],
                    help="ensure: build only when no usable archive exists (make setup)")
    args = ap.parse_args(argv)
    path = archive_path()
    if path is None:
        print(f"[jvm-archive] disabled ({ENV}=off)")
        return 0
    if args.action == "status":
        opt = option()
        print(f"[jvm-archive] {path}: " + (f"in use ({opt})" if opt else
              "not usable (missing, incomplete or built for another pyspark/java): runs start without it"))
        return 0 if opt else 1
    if args.action == "remove":
        remove(path)
        print(f"[jvm-archive] removed {path}")
        return 0
    if args.action == "ensure" and option() and _trained_on(path) == TRAINED_ON:
        print(f"[jvm-archive] {path}: up to date")
        return 0
    print(f"[jvm-archive] building {path} (a tiny run of each job kind on the demo shop, ~45 s)", flush=True)
    try:
        m = build(path)
    except RuntimeError as e:
        print(f"[jvm-archive] ERROR: {e}\n[jvm-archive] runs start without an archive", file=sys.stderr)
        return 1
    print(f"[jvm-archive] built {path}: {m['size'] / 2**20:.0f} MiB in {m['training_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
