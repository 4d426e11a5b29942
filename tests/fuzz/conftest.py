"""Hypothesis profiles of the fuzz suite: "ci" (the default: the whole suite in well under a minute on
two cores) and "long" (``SPECSOAK_FUZZ=long``, by hand: docs/reliability.md#fuzzing).

The profiles are registered here and applied by ``tests.fuzz.common.fuzz`` to the fuzz tests only:
no profile is loaded globally, so other hypothesis tests keep their own settings.
"""

from __future__ import annotations

import os
from datetime import timedelta

from hypothesis import HealthCheck, settings

_SLOW_OK = [
    HealthCheck.too_slow,
    HealthCheck.data_too_large,
    HealthCheck.filter_too_much,
    HealthCheck.large_base_example,
]

# a single example over its deadline is a hang: it fails (never skips); shared CPUs get a generous one
settings.register_profile(
    "ci", max_examples=150, deadline=timedelta(seconds=3), suppress_health_check=_SLOW_OK, print_blob=True
)
settings.register_profile(
    "long", max_examples=2000, deadline=timedelta(seconds=3), suppress_health_check=_SLOW_OK, print_blob=True
)

PROFILE = os.environ.get("SPECSOAK_FUZZ", "ci") or "ci"
if PROFILE not in ("ci", "long"):
    raise ValueError(f"SPECSOAK_FUZZ={PROFILE!r}: the fuzz profiles are 'ci' and 'long'")
