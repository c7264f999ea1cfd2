"""The three OpenAPI documents pass Redocly's `recommended` rules with no error and no warning.

The Redocly CLI is installed by scripts/setup into tools/redocly; a missing
one fails under CI=true.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support.ci import required_in_ci

ROOT = Path(__file__).resolve().parents[2]
REDOCLY = ROOT / "tools" / "redocly" / "node_modules" / ".bin" / "redocly"
DOCUMENTS = ("upstream.yaml", "computer.yaml", "launcher.yaml")


def lint(document: Path, home: Path) -> dict[str, Any]:
    """Redocly's JSON report of `document` under the `recommended` ruleset."""
    if not REDOCLY.exists():
        required_in_ci("the Redocly CLI (scripts/setup installs it into tools/redocly)")
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        # Never the real home; no telemetry or update check from a test run.
        "HOME": str(home),
        "REDOCLY_TELEMETRY": "off",
        "REDOCLY_SUPPRESS_UPDATE_NOTICE": "true",
        "NO_COLOR": "1",
    }
    done = subprocess.run(
        [str(REDOCLY), "lint", "--extends=recommended", "--format=json", str(document)],
        capture_output=True,
        env=env,
        cwd=home,
        timeout=300,
        check=False,
    )
    try:
        report: dict[str, Any] = json.loads(done.stdout)
    except json.JSONDecodeError:
        pytest.fail(
            f"redocly gave no JSON report (exit {done.returncode}): {done.stderr[-2000:]!r}"
        )
    return report


def _problems(report: dict[str, Any]) -> list[str]:
    return [
        f"{p['severity']} {p['ruleId']}: {p['message']} at {p['location'][0]['pointer']}"
        for p in report["problems"]
    ]


@pytest.mark.parametrize("name", DOCUMENTS)
def test_the_document_passes_the_recommended_rules(name: str, tmp_path: Path) -> None:
    report = lint(ROOT / "openapi" / name, tmp_path)
    assert report["totals"]["errors"] == 0 and report["totals"]["warnings"] == 0, _problems(report)


def test_the_linter_finds_what_the_documents_were_fixed_for(tmp_path: Path) -> None:
    # No license, no security, no 4xx answer: what the three documents lacked.
    bare = tmp_path / "bare.yaml"
    bare.write_text(
        "openapi: 3.1.0\n"
        "info: {title: t, version: '1', description: d}\n"
        "servers: [{url: 'http://x'}]\n"
        "paths:\n"
        "  /a:\n"
        "    get:\n"
        "      operationId: a\n"
        "      summary: a\n"
        "      responses: {'200': {description: ok}}\n"
    )
    rules = {p["ruleId"] for p in lint(bare, tmp_path)["problems"]}
    assert {"info-license", "security-defined", "operation-4xx-response"} <= rules
