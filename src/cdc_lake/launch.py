"""Launch settings of a run, chosen from the backlog it will read: the driver JVM's JIT and
Spark's expression evaluation.

A scheduled run is a fresh spark-submit: what pays back in a long JVM (the C2 JIT, generated
code) costs more than it saves on a few hundred rows, and the opposite holds for a big backlog.
The operator sizes the backlog (:mod:`cdc_lake.cdc.backlog`, no Spark) and asks here.

Example::

    launch_conf(2_000_000)      # {'spark.driver.defaultJavaOptions': C1_ONLY}
    codegen_conf(300_000)       # interpreted expressions for a small CDC run
    driver_jit("-XX:TieredStopAtLevel=1 -Xss4m")   # 'C1'
"""

from __future__ import annotations

import re
from collections.abc import Callable

# JVM options of the driver, read by spark-submit's launcher before the driver JVM starts, so they
# go on the spark-submit command line (the operator) or into the builder of a bare `python` run.
# A scheduled run is short: the C2 JIT compiler does not pay back within it and competes with the
# tasks for the cores (local mode runs the tasks in the driver JVM). A big backlog is the
# opposite: the hot loops run long enough for C2 code to win. Measured on 2 cores, one ingest of
# N MB into a fresh lake, C1 only vs full JIT (mean of 2 each; docs/benchmarks.md): 0.25 MB (small increment)
# 12.7 vs 17.1 s; 6 MB 11.8 vs 15.0; 16 MB 14.0 vs 17.5; 32 MB 17.2 vs 18.7; 65 MB 31.4 vs 26.8
# (27-28 s both a day earlier); 97 MB 52.7 vs 40.7; 130 MB 54.9 vs 47.5; 325 MB 104 vs 66 s.
# ``defaultJavaOptions`` is prepended to ``extraJavaOptions``; a pipeline that sets it in its
# spark conf decides itself.
# C1 alone gets a 48 MiB code cache (the tiered default is 240 MiB), and a full code cache
# switches the JIT off for the rest of the JVM's life ("CodeCache is full. Compiler has been
# disabled"): seen in one warm session after a dozen runs of two events pipelines, whose next
# run then took 16 s instead of 6 s (2026-12-01). The cache is reserved address space, committed
# as code is compiled, so the larger reservation costs nothing until it is used.
DRIVER_JAVA_OPTIONS = "spark.driver.defaultJavaOptions"
C1_ONLY = "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m"
LAUNCH_CONF = {DRIVER_JAVA_OPTIONS: C1_ONLY}
FULL_JIT_FROM_MB = 48  # CDC default of ``spark.full_jit_from_mb``


def launch_conf(backlog_bytes: int | None, full_jit_from_mb: int = FULL_JIT_FROM_MB, *,
                archive: str | None = None) -> dict[str, str]:
    """Driver JVM options for a run that will read ``backlog_bytes`` of input.

    C1-only JIT below ``full_jit_from_mb`` MiB or when the backlog is unknown (``None``: the
    common scheduled run is small); nothing (the JVM's default tiered C1+C2 JIT) from there on.
    ``archive``: the class-data-sharing option of :func:`cdc_lake.jvm_archive.option` (callers
    that launch a JVM pass it; None: no archive), added whatever the JIT.

    Example::

        launch_conf(2_000_000)      # {'spark.driver.defaultJavaOptions': C1_ONLY}
        launch_conf(400 * 2**20)    # {}
        launch_conf(None, archive="-XX:SharedArchiveFile=/venv/share/cdc-lake/spark-driver.jsa")
    """
    opts = [] if backlog_bytes is not None and backlog_bytes >= full_jit_from_mb * 2**20 else [C1_ONLY]
    if archive:
        opts.append(archive)
    return {DRIVER_JAVA_OPTIONS: " ".join(opts)} if opts else {}


# Spark's expression evaluation, per run. Spark compiles Java code for every operator of a
# query (whole-stage code generation, Janino) the first time the JVM sees it; a scheduled run is
# a fresh JVM whose CDC batch has about a hundred such classes (2-3 s of compiling on 2 cores)
# and a few hundred rows to run them on. Interpreted evaluation skips the compiling and loses
# per row. Measured 2026-11-29 (spark-submits of the CDC job alternating on one lake, C1 JIT,
# median of 2-4 pairs; docs/benchmarks.md): 800 events 10.84 -> 9.86 s, 5k 13.59 -> 12.48,
# 20k (6.5 MB) 14.96 -> 14.12, 60k (19.5 MB) 17.37 -> 20.43, 200k 30.2 -> 45.2 s. Both settings
# are plain SQL confs (``factoryMode`` is internal: Spark's own suites run every expression in
# both modes); a pipeline that sets either in ``spark.conf`` decides itself.
INTERPRETED_CONF = {"spark.sql.codegen.wholeStage": "false",
                    "spark.sql.codegen.factoryMode": "NO_CODEGEN"}
INTERPRETED_BELOW_MB = 8  # CDC default of ``spark.interpreted_below_mb``


def codegen_conf(backlog_bytes: int | None,
                 interpreted_below_mb: int = INTERPRETED_BELOW_MB) -> dict[str, str]:
    """Session confs for a run that will read ``backlog_bytes``: interpreted expressions (no
    generated code) below ``interpreted_below_mb`` MiB, Spark's default (generated code) from
    there on and when the backlog is unknown (``None``: its size cannot be ruled small).

    Example::

        codegen_conf(300_000)       # INTERPRETED_CONF: {'spark.sql.codegen.wholeStage': 'false',
                                    #   'spark.sql.codegen.factoryMode': 'NO_CODEGEN'}
        codegen_conf(64 * 2**20)    # {}
        codegen_conf(300_000, 0)    # {} (0: always generated code)
    """
    if backlog_bytes is None or backlog_bytes >= interpreted_below_mb * 2**20:
        return {}
    return dict(INTERPRETED_CONF)


def codegen_mode(get_conf: Callable[[str], str | None]) -> str:
    """``"interpreted"`` when a session runs both settings of :data:`INTERPRETED_CONF`, else
    ``"generated"``; ``get_conf(key)`` reads the session's value (``spark.conf.get``)."""
    interpreted = all(str(get_conf(k)).lower() == v.lower() for k, v in INTERPRETED_CONF.items())
    return "interpreted" if interpreted else "generated"


def driver_jit(java_options: str | None) -> str | None:
    """``"C1"`` when the driver JVM's options stop tiered compilation below C2, else ``"C1+C2"``
    (``None`` for unknown options)."""
    if java_options is None:
        return None
    m = re.findall(r"-XX:TieredStopAtLevel=(\d)", java_options or "")
    return "C1" if m and int(m[-1]) < 4 else "C1+C2"


def class_archive(java_options: str | None) -> str | None:
    """The class-data-sharing archive the driver JVM was started with (``-XX:SharedArchiveFile``)."""
    m = re.findall(r"-XX:SharedArchiveFile=(\S+)", java_options or "")
    return m[-1] if m else None
