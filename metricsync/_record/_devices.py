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
    """Device states by device, and lanes by name. The caller holds the store's lock."""

    def __init__(self) -> None:
        self.states: dict[Any, Any] = {}  # torch.device -> DeviceState
        #: name -> (device, state, row, whether the device is meta)
        self.lanes: dict[str, tuple[Any, Any, int, bool]] = {}

    def __bool__(self) -> bool:
        return bool(self.states)

    def add(self, name: str, slot: int, spec: Spec, x: Any, w: Any, m: Any, now: float) -> None:
        """Pend a checked record of ``name`` (table slot ``slot``) on ``x``'s device."""
        from ._device import DeviceState

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
        self.lanes[name] = (x.device, state, row, state.meta)

    def lane(self, name: str, device: Any) -> tuple[Any, int] | None:
        """``(state, row)`` of ``name`` on ``device``, if a record of it went there."""
        lane = self.lanes.get(name)
        if lane is None or device != lane[0] or (lane[3] and not meta_allowed()):
            return None  # a meta lane outside meta_records(): the checked path refuses
        return lane[1], lane[2]

    def pend_scalar(self, name: str, x: Any) -> bool:
        """Pend a plain 0-d tensor of ``name`` on its lane (:meth:`lane`, inlined: the
        hottest device record); False when ``name`` has no lane on ``x``'s device."""
        lane = self.lanes.get(name)
        if lane is None or x.device != lane[0] or (lane[3] and not meta_allowed()):
            return False
        lane[1].pend_scalar(lane[2], x)
        return True

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
