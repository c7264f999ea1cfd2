"""Which `opencode --version` answers the Computer refuses (issue 20, 11): pure."""

from __future__ import annotations

import pytest

from computer_service.engine.user_opencode import unsupported_opencode
from computer_service.parts_protocol import LauncherStatus


@pytest.mark.parametrize("version", ["1.18.33", "0.15.2", "v1.2.0", None, "", "local"])
def test_opencode_1_and_unreadable_versions_run(version: str | None) -> None:
    assert unsupported_opencode(version) is None


@pytest.mark.parametrize("version", ["2.0.0", "v2.1.0", "opencode 3.0.0-beta.1", "10.0.0"])
def test_opencode_2_and_later_are_refused_with_what_to_do(version: str) -> None:
    reason = unsupported_opencode(version)
    assert reason is not None and version in reason
    assert "opencode-ai@1.18.33" in reason and "opencode_path" in reason


def test_the_refusal_is_every_agents_problem() -> None:
    status = LauncherStatus(True, "bwrap", None, True, "2.0.0")
    assert status.engine_reason() == unsupported_opencode("2.0.0")
    assert status.unavailable_reason() == f"engine unavailable: {status.engine_reason()}"
    assert LauncherStatus(True, "bwrap", None, True, "1.18.33").unavailable_reason() is None
