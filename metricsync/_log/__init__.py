"""The JSONL metric log: keys as logs hold them, its records, and the readers (forward,
from the end, following a file). The ``jsonl`` backend writes it, the command line reads it."""
