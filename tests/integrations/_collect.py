"""A backend object that keeps what a Tracker hands it, for the integration tests."""

from __future__ import annotations

from collections.abc import Mapping


class Collect:
    """Keeps every logged step as ``(step, values, formats)``."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, dict[str, float], dict[str, str | None]]] = []
        self.closed = False

    def log(
        self, values: Mapping[str, float], step: int, formats: Mapping[str, str | None]
    ) -> None:
        self.rows.append((step, dict(values), dict(formats)))

    def close(self) -> None:
        self.closed = True

    def steps(self) -> list[int]:
        return [step for step, _, _ in self.rows]
