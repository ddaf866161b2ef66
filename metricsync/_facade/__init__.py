"""The ``Metrics`` container: the facade over recording, syncing and computing,
with merge, timers and the Ray ``collect`` built on it."""
