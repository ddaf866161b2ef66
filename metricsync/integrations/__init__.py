"""Hooks that plug metricsync into the trainers people already use.

Each integration is one import, and each imports its own optional package
only when you import it (importing :mod:`metricsync` or this package never
imports transformers, Lightning or accelerate):

================================================  ===========================================
module                                            what it gives
================================================  ===========================================
:mod:`metricsync.integrations.transformers`       ``MetricsyncCallback``, a ``TrainerCallback``
                                                  for Hugging Face and TRL trainers
:mod:`metricsync.integrations.lightning`          ``MetricsyncCallback`` (one packed sync per
                                                  step) and ``MetricsyncLogger``
:mod:`metricsync.integrations.accelerate`         ``MetricsyncTracker``, for
                                                  ``Accelerator(log_with=...)``
:mod:`metricsync.integrations.verl`               ``Tracking``, with verl's ``Tracking``
                                                  interface, and ``install()``
================================================  ===========================================

A missing package raises ``ImportError`` naming the extra to install
(``pip install "metricsync[transformers]"``, ``[lightning]``, ``[accelerate]``);
the verl module needs no extra.

>>> import tempfile
>>> from metricsync.integrations.verl import Tracking
>>> tracking = Tracking("demo", "exp1", "console", run_dir=tempfile.mkdtemp())
>>> tracking.log({"actor/lr": 1e-6, "critic/score/mean": 0.75}, step=1)
step 1 | actor/lr 1.00e-06  critic/score/mean     0.75
>>> tracking.finish()
"""

from __future__ import annotations

__all__: list[str] = []
