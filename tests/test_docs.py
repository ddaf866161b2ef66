"""The documentation site builds strictly (a broken reference or link fails) and covers the API."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import metricsync
import metricsync.backends

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings_handlers.python")
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return out


def _anchors(page: Path) -> set[str]:
    return set(re.findall(r'id="([\w.]+)"', page.read_text()))


def test_every_public_name_has_its_reference_entry(site: Path) -> None:
    documented = _anchors(site / "api" / "metricsync" / "index.html")
    missing = [n for n in metricsync.__all__ if f"metricsync.{n}" not in documented]
    assert missing == []
    documented = _anchors(site / "api" / "backends" / "index.html")
    missing = [
        n for n in metricsync.backends.__all__ if f"metricsync.backends.{n}" not in documented
    ]
    assert missing == []


def test_docstring_examples_render_as_code_not_quotes(site: Path) -> None:
    page = (site / "api" / "metricsync" / "index.html").read_text()
    assert 'class="language-pycon' in page or 'class="gp">&gt;&gt;&gt;' in page  # highlighted
    assert "<blockquote>" not in page  # a doctest left as Markdown would nest quotes
    assert ":class:" not in page and ":meth:" not in page  # roles became links


def test_the_definitions_page_states_each_definition(site: Path) -> None:
    text = " ".join((ROOT / "docs" / "definitions.md").read_text().split())
    for needle in (
        "linear interpolation",
        "relative accuracy",
        "inverted-CDF",
        "wall clock",
        "the larger value wins",
        '`"first"`',
        "A **mask** is a weight of 0 or 1",
        "ddof",
    ):
        assert needle in text
    assert (site / "definitions" / "index.html").exists()


def test_every_integration_guide_is_in_the_navigation(site: Path) -> None:
    config = (ROOT / "mkdocs.yml").read_text()
    for guide in sorted((ROOT / "docs" / "integrations").glob("*.md")):
        assert f"integrations/{guide.name}" in config
        assert (site / "integrations" / guide.stem / "index.html").exists()


def _griffe_rst():  # type: ignore[no-untyped-def]
    pytest.importorskip("griffe")
    spec = importlib.util.spec_from_file_location("griffe_rst", ROOT / "tools" / "griffe_rst.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_docstring_converter_fences_examples_tables_and_literal_blocks() -> None:
    convert = _griffe_rst().convert
    text = "\n".join(
        [
            "See :func:`~pkg.mod.f` and :mod:`pkg._private`.",
            "",
            "==== =====",
            "name value",
            "==== =====",
            "a    1",
            "==== =====",
            "",
            "Declare it in ``pyproject.toml``::",
            "",
            "    [x]",
            '    y = "z"',
            "",
            ">>> f(1)",
            "2",
            "",
            "After.",
        ]
    )
    private = {"pkg.mod.f": "pkg.mod.f", "pkg._private": None}
    got = convert(text, private.get).split("\n")
    assert got[0] == "See [`f`][pkg.mod.f] and `_private`."
    assert got[2:9] == [
        "```text",
        "==== =====",
        "name value",
        "==== =====",
        "a    1",
        "==== =====",
        "```",
    ]
    assert "Declare it in ``pyproject.toml``:" in got
    start = got.index("```text", 9)
    assert got[start : start + 4] == ["```text", "[x]", 'y = "z"', "```"]
    start = got.index("```pycon")
    assert got[start : start + 4] == ["```pycon", ">>> f(1)", "2", "```"]
    assert got[-1] == "After."
