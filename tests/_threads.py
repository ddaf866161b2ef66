"""Running test code on several threads that switch often."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def switching_every_microsecond() -> Iterator[None]:
    """Threads switch every microsecond inside (races show up), as before after."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def run_threads(workers: list[Callable[[], Any]]) -> list[BaseException]:
    """Run every worker in its own thread; the exceptions they raised."""
    errors: list[BaseException] = []

    def guard(fn: Callable[[], Any]) -> None:
        try:
            fn()
        except BaseException as exc:  # collected and asserted on
            errors.append(exc)

    threads = [threading.Thread(target=guard, args=(fn,)) for fn in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors
