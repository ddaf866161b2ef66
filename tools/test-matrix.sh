#!/usr/bin/env bash
# The numpy-only core on every other supported Python found here (3.10, 3.12, 3.13 by
# default; MATRIX_PYTHONS="3.10 3.13" to choose). Each gets a venv under .venv-matrix/
# with the project, numpy, pytest, pytest-timeout and hypothesis only (no torch: its
# local wheel is for 3.11), and runs the whole suite: what needs torch or a backend's
# package skips. Interpreters are looked up on PATH and under pyenv; a missing one is
# reported and skipped. Exits non-zero if any interpreter's run fails.
set -euo pipefail
cd "$(dirname "$0")/.."

versions=${MATRIX_PYTHONS-"3.10 3.12 3.13"}
pyenv_root=${PYENV_ROOT:-$HOME/.pyenv}

find_python() {
    local version=$1 candidate
    for candidate in $(command -v "python$version" || true) \
        $(ls -d "$pyenv_root"/versions/"$version".*/bin/python"$version" 2>/dev/null | sort -rV); do
        if "$candidate" -c "import venv" >/dev/null 2>&1; then
            echo "$candidate"
            return 0
        fi
    done
    return 1
}

failed=()
tested=()
for version in $versions; do
    if ! python=$(find_python "$version"); then
        echo "test-matrix: no Python $version found; skipped"
        continue
    fi
    venv=.venv-matrix/py$version
    [ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
    if [ ! -f "$venv/.installed" ] || [ pyproject.toml -nt "$venv/.installed" ] \
        || [ constraints.txt -nt "$venv/.installed" ]; then
        "$venv/bin/python" -m pip install --disable-pip-version-check -q -c constraints.txt \
            -e . pytest pytest-timeout hypothesis
        touch "$venv/.installed"
    fi
    echo "test-matrix: $("$venv/bin/python" -V) without torch"
    if "$venv/bin/python" -m pytest -q -p no:cacheprovider "$@"; then
        tested+=("$version")
    else
        failed+=("$version")
    fi
done

echo "test-matrix: passed on ${tested[*]:-none}; failed on ${failed[*]:-none}"
[ ${#failed[@]} -eq 0 ]
