"""The ``metricsync`` command line: show, compare, plot, demo and bench, a program
built on the public API."""
