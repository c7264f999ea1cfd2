"""What a missing required component means: a skip locally, a failure in CI."""

from __future__ import annotations

import os

import pytest


def required_in_ci(what: str) -> None:
    """Skip locally when a required component is missing, but fail in CI (CI=true)."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{what} is required in CI but missing")
    pytest.skip(f"{what} missing (required in CI)")
