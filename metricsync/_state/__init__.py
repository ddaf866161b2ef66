"""The state of a set of metrics: specs, state columns and their merge algebra, the
table, the statistics computed from it, and its binary format. Imports nothing above it."""
