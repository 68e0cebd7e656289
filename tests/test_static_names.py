"""Static check of every Python file the product and its tests run: no name used that is never
defined or imported, and no unused import in product code (``# noqa`` on the line opts out).

Found 2026-11-29: ``enrich/state.py`` called ``checkpoint_bypass`` without importing it. The
branch (an own table whose Delta checkpoint is damaged) raised ``NameError`` only when reached,
and no test reached it. pyflakes (pinned in the dev extras) reads the files without importing
them, so a name error in a rarely taken branch fails here, in the default tier, in seconds.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pyflakes import api, messages, reporter

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("src", "spark_jobs", "dags", "plugins", "benchmarks", "scripts")
NAME_ERRORS = (messages.UndefinedName, messages.UndefinedLocal, messages.UndefinedExport)


class _Collect(reporter.Reporter):
    def __init__(self) -> None:
        self.found: list[messages.Message] = []
        self.broken: list[str] = []

    def flake(self, message: messages.Message) -> None:
        self.found.append(message)

    def syntaxError(self, filename, msg, lineno, offset, text) -> None:  # type: ignore[no-untyped-def]  # noqa: N802
        self.broken.append(f"{filename}:{lineno}: {msg}")

    def unexpectedError(self, filename, msg) -> None:  # type: ignore[no-untyped-def]  # noqa: N802
        self.broken.append(f"{filename}: {msg}")


def _check(folders: tuple[str, ...]) -> _Collect:
    out = _Collect()
    for folder in folders:
        for f in sorted((ROOT / folder).rglob("*.py")):
            api.checkPath(str(f), out)
    return out


def _noqa(message: messages.Message) -> bool:
    lines = Path(message.filename).read_text(encoding="utf-8").splitlines()
    return 0 < message.lineno <= len(lines) and "# noqa" in lines[message.lineno - 1]


def _describe(found: list[messages.Message]) -> str:
    return "\n".join(f"{Path(m.filename).relative_to(ROOT)}:{m.lineno}: {m.message % m.message_args}"
                     for m in found)


def test_product_code_uses_only_defined_names_and_imports_nothing_unused() -> None:
    out = _check(PRODUCT)
    assert not out.broken, out.broken
    bad = [m for m in out.found if isinstance(m, (*NAME_ERRORS, messages.UnusedImport)) and not _noqa(m)]
    assert not bad, "\n" + _describe(bad)


def test_tests_use_only_defined_names() -> None:
    out = _check(("tests",))
    assert not out.broken, out.broken
    bad = [m for m in out.found if isinstance(m, NAME_ERRORS) and not _noqa(m)]
    assert not bad, "\n" + _describe(bad)


@pytest.mark.parametrize("code, expected", [
    ("def f():\n    return checkpoint_bypass(1)\n", messages.UndefinedName),
    ("import os\n", messages.UnusedImport),
])
def test_the_check_sees_what_it_guards(tmp_path: Path, code: str, expected: type) -> None:
    """The check itself can fail: the 2026-11-29 defect's shape, and an unused import."""
    f = tmp_path / "m.py"
    f.write_text(code, encoding="utf-8")
    out = _Collect()
    api.checkPath(str(f), out)
    assert [type(m) for m in out.found] == [expected]
