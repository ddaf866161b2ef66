"""Packaging: one version, typed, licensed, and a wheel that holds what it promises."""

from __future__ import annotations

import importlib.metadata
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import metricsync

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = (ROOT / "pyproject.toml").read_text()


def test_the_version_is_written_once_and_installed_metadata_agrees() -> None:
    assert re.fullmatch(r"\d+\.\d+\.\d+(\.dev\d+|rc\d+)?", metricsync.__version__)
    assert importlib.metadata.version("metricsync") == metricsync.__version__
    assert 'dynamic = ["version"]' in PYPROJECT
    assert 'version = { attr = "metricsync._version.__version__" }' in PYPROJECT
    project = PYPROJECT.split("\n[project]\n", 1)[1].split("\n[", 1)[0]
    assert not re.search(r"^version\s*=", project, flags=re.M)  # no second, static copy
    written = [
        p.relative_to(ROOT)
        for p in (ROOT / "metricsync").rglob("*.py")
        if re.search(r"^__version__\s*=", p.read_text(), flags=re.M)
    ]
    assert written == [Path("metricsync/_version.py")]


def test_the_changelog_names_the_version_or_unreleased() -> None:
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert changelog.startswith("# Changelog")
    assert "## [Unreleased]" in changelog
    versions = re.findall(r"^## \[(\d[^\]]*)\]", changelog, flags=re.M)
    assert metricsync.__version__ in versions


def test_the_all_extra_holds_every_runtime_extra() -> None:
    requires = importlib.metadata.requires("metricsync") or []
    extras = set(importlib.metadata.metadata("metricsync").get_all("Provides-Extra") or [])
    [all_line] = [r for r in requires if r.startswith("metricsync[") and 'extra == "all"' in r]
    in_all = set(re.search(r"\[(.*?)\]", all_line).group(1).split(","))  # type: ignore[union-attr]
    assert in_all == extras - {"all", "dev", "docs", "verl"}  # verl: what its tests import


@pytest.mark.timeout(120)
def test_the_wheel_ships_py_typed_and_the_license(tmp_path: Path) -> None:
    pytest.importorskip("setuptools", minversion="70.1")  # builds wheels by itself
    source = tmp_path / "source"  # a copy, so the build leaves nothing in the checkout
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(
        ROOT / "metricsync", source / "metricsync", ignore=shutil.ignore_patterns("__pycache__")
    )
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
    command += ["--disable-pip-version-check", "-w", str(tmp_path), str(source)]
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    [wheel] = tmp_path.glob("metricsync-*.whl")
    assert wheel.name.startswith(f"metricsync-{metricsync.__version__}-")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        meta_name = next(n for n in names if n.endswith(".dist-info/METADATA"))
        metadata = archive.read(meta_name).decode()
    assert "metricsync/py.typed" in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert f"Version: {metricsync.__version__}\n" in metadata
    assert "Classifier: License :: OSI Approved :: Apache Software License" in metadata
    assert "Classifier: Typing :: Typed" in metadata
    assert "Project-URL: Documentation" in metadata
    assert not any(n.startswith(("tests/", "docs/", "bench/")) for n in names)


SMOKE = (
    "import metricsync as ms, numpy as np\n"
    "m = ms.Metrics({'x': ms.Spec(('mean', 'max'))})\n"
    "m.record('x', np.array([1.0, 3.0]))\n"
    "assert m.compute() == {'x/mean': 2.0, 'x/max': 3.0}, m.compute()\n"
    "assert ms.Metrics.from_bytes(m.to_bytes()).compute() == m.compute()\n"
    "print(ms.__version__)\n"
)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_built_wheel_and_sdist_install_in_a_clean_venv(tmp_path: Path) -> None:
    pytest.importorskip("build")
    source = tmp_path / "source"  # a copy, so the build leaves nothing in the checkout
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(
        ROOT / "metricsync", source / "metricsync", ignore=shutil.ignore_patterns("__pycache__")
    )
    dist = tmp_path / "dist"
    built = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(source)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    [wheel] = dist.glob("metricsync-*.whl")
    [sdist] = dist.glob("metricsync-*.tar.gz")
    venv = tmp_path / "clean"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    pip += ["-c", str(ROOT / "constraints.txt")]
    for artifact in (wheel, sdist):
        done = subprocess.run(
            [*pip, "--force-reinstall", str(artifact)], capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr[-3000:]
        smoke = subprocess.run(
            [str(python), "-c", SMOKE], capture_output=True, text=True, cwd=tmp_path
        )
        assert smoke.returncode == 0, smoke.stderr[-3000:]
        assert smoke.stdout.strip() == metricsync.__version__
        cli = subprocess.run(
            [str(venv / "bin" / "metricsync"), "--version"], capture_output=True, text=True
        )
        assert cli.returncode == 0 and metricsync.__version__ in cli.stdout + cli.stderr


def test_an_editable_install_is_a_path_that_type_checkers_follow() -> None:
    # setuptools' import-hook finder hides the package (and its py.typed) from mypy
    import site

    installed = [
        p for d in site.getsitepackages() for p in Path(d).glob("__editable__*metricsync*")
    ]
    if not installed:
        pytest.skip("metricsync is not installed in editable mode here")
    assert not [p for p in installed if p.name.endswith("_finder.py")]
    assert [p for p in installed if p.suffix == ".pth"]
