"""The accelerator side of one ``Metrics``: a :class:`~metricsync._record._device.DeviceState` per
device, and each name's *lane* (device, state, row) so later records go straight to their row.
Importing this module does not import torch.

>>> devices = Devices()
>>> bool(devices), devices.recorded_slots()
(False, set())
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._state._spec import Spec
from .._state._table import StateTable
from ._convert import meta_allowed

__all__ = ["Devices", "DeviceRead", "merge_devices"]

#: one device's state on the host: ``(slots, cols, cells)``
DeviceRead = tuple[Any, np.ndarray, dict[int, Any]]


class Devices:
    """Device states by device, and lanes by name. The caller holds the store's lock, but
    for :meth:`Lane.take <metricsync._record._device_refs.Lane.take>` of a lane from ``lanes``."""

    def __init__(self) -> None:
        self.states: dict[Any, Any] = {}  # torch.device -> DeviceState
        #: name -> its Lane (state and row) on the device of its last checked record; the
        #: dict itself is kept for good, so ``Metrics.record`` holds it (see :meth:`clear`)
        self.lanes: dict[str, Any] = {}

    def __bool__(self) -> bool:
        return bool(self.states)

    def clear(self) -> None:
        """Forget every state and lane (a lane taken before this pends into a dropped state)."""
        self.states.clear()
        self.lanes.clear()

    def appended(self) -> int:
        """0-d references the lanes appended so far: grows with each, shrinks only at
        :meth:`clear` (see ``Store.folded``)."""
        return sum(state.appended() for state in self.states.values())

    def fold_full(self) -> None:
        """Fold the states whose inbox holds their ``ref_limit`` of references."""
        for state in self.states.values():
            if len(state.inbox) >= state.ref_limit:
                state.commit()

    def add(self, name: str, slot: int, spec: Spec, x: Any, w: Any, m: Any, now: float) -> None:
        """Pend a checked record of ``name`` (table slot ``slot``) on ``x``'s device."""
        from ._device import DeviceState
        from ._device_refs import Lane

        state = self.states.get(x.device)
        if state is None:
            try:  # float64 state on the device (a device without float64, e.g. mps: refused)
                state = DeviceState(x.device)
            except (TypeError, RuntimeError) as exc:
                raise TypeError(
                    f"metric {name!r}: tensors on {x.device} cannot be accumulated there "
                    f"({exc}); record them on another device, e.g. t.cpu()"
                ) from None
            self.states[x.device] = state
        row = state.add(slot, spec, x, w, m, now)
        lane = self.lanes.get(name)
        if lane is None or lane.state is not state:
            self.lanes[name] = Lane(state, row)

    def lane(self, name: str, device: Any) -> Any:
        """The :class:`~metricsync._record._device_refs.Lane` of ``name`` on ``device``, if a
        record of it went there (else None)."""
        lane = self.lanes.get(name)
        if lane is None or device != lane.device or (lane.meta and not meta_allowed()):
            return None  # a meta lane outside meta_records(): the checked path refuses
        return lane

    def recorded_slots(self) -> set[int]:
        """Table slots holding device records, folded or pending."""
        out: set[int] = set()
        for state in self.states.values():
            out |= state.recorded_slots()
        return out

    def read(self, names: list[str]) -> list[DeviceRead]:
        """Each device's state on the host; ``ValueError`` naming the metric (from
        ``names``, by slot) when a record failed its checks on the device (an error is
        never cleared by a read: every observation raises it until ``reset()``)."""
        out = []
        for state in self.states.values():
            slots, cols, cells, errors = state.snapshot()
            if errors.any():  # kept: every later read raises too, until reset()
                from ._device_fold import device_error  # loaded: a device recorded

                raise device_error(names[slots[int(np.argmax(errors))]], errors.max())
            out.append((slots, cols, cells))
        return out


def merge_devices(table: StateTable, devices: list[DeviceRead]) -> None:
    """Merge what :meth:`Devices.read` returned into ``table``."""
    for slots, cols, cells in devices:
        table.merge_state(slots, cols)
        with np.errstate(over="ignore"):  # weight sums beyond float64 are inf
            for slot, extra in cells.items():
                table.sketches[slot] += extra
