"""Importing metricsync or its integrations package never imports a trainer's package, and an
integration whose package is missing says which extra to install."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

OPTIONAL = ("transformers", "trl", "lightning", "pytorch_lightning", "accelerate", "verl")


def test_importing_the_package_imports_no_trainer() -> None:
    code = (
        "import sys, metricsync, metricsync.integrations, metricsync.integrations.verl\n"
        f"print(sorted(m for m in {OPTIONAL!r} if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("module", "hidden", "extra"),
    [
        ("transformers", ("transformers",), "transformers"),
        ("lightning", ("lightning", "lightning.pytorch", "pytorch_lightning"), "lightning"),
        ("accelerate", ("accelerate", "accelerate.tracking"), "accelerate"),
    ],
)
def test_a_missing_package_names_its_extra(
    monkeypatch: pytest.MonkeyPatch, module: str, hidden: tuple[str, ...], extra: str
) -> None:
    for name in hidden:
        monkeypatch.setitem(sys.modules, name, None)  # importing it now raises ImportError
    monkeypatch.delitem(sys.modules, f"metricsync.integrations.{module}", raising=False)
    with pytest.raises(ImportError) as caught:
        importlib.import_module(f"metricsync.integrations.{module}")
    assert f'pip install "metricsync[{extra}]"' in str(caught.value)
    assert f"metricsync.integrations.{module}" in str(caught.value)
