"""Failure classification, built from the real OpenCode samples (05_*, 03_*, 04*)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import sandbox_launcher
from computer_service.engine.base import EngineEvent, FailureClass
from computer_service.engine.events import engine_event_of
from computer_service.engine.failures import (
    RunOutcome,
    blames_content,
    classify,
    model_id_failure,
    redact,
)
from sandbox_launcher.limits import RunCgroup
from tests.support.ci import required_in_ci

SAMPLES = Path(__file__).resolve().parents[2] / "tests" / "samples" / "opencode"


def outcome_of(name: str, **override: object) -> RunOutcome:
    """Rebuild a run's outcome from its recorded stdout, stderr and exit status."""
    stdout = (SAMPLES / f"{name}.stdout.jsonl").read_bytes()
    stderr = (SAMPLES / f"{name}.stderr.txt").read_text()
    meta_file = SAMPLES / f"{name}.meta.json"
    exit_code = json.loads(meta_file.read_text())["exit_code"] if meta_file.exists() else 1
    events = [engine_event_of(x) for x in stdout.splitlines() if x.strip()]
    errors = [e for e in events if e.type == "error"]
    values: dict[str, object] = {
        "exit_code": exit_code,
        "signal": None,
        "launcher_reason": None,
        "last_error": errors[-1] if errors else None,
        "stdout_empty": not events,
        "stderr_tail": stderr[-64 * 1024 :],
    }
    values.update(override)
    return RunOutcome(**values)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("sample", "cls", "in_reason"),
    [
        ("05_http_401", FailureClass.NOT_LOGGED_IN, "HTTP 401"),
        ("05_http_429", FailureClass.RATE_LIMITED, "Rate limit reached"),
        ("05_http_429RA", FailureClass.RATE_LIMITED, "Rate limit reached"),
        ("05_http_500", FailureClass.ENGINE_ERROR, "HTTP 500: Internal server error"),
        ("05_connection_refused", FailureClass.ENGINE_ERROR, "Cannot connect to API"),
        ("03_session_not_found", FailureClass.SESSION_INVALID, "no longer exists"),
        ("03b_session_bad_format", FailureClass.SESSION_INVALID, "no longer exists"),
        ("04a_model_unknown_in_provider", FailureClass.MODEL_UNAVAILABLE, "local/nope"),
        ("04b_model_unknown_provider", FailureClass.MODEL_UNAVAILABLE, "nope/nope"),
        ("19_401_without_print_logs", FailureClass.NOT_LOGGED_IN, "opencode auth login"),
    ],
)
def test_samples_classify(sample: str, cls: FailureClass, in_reason: str) -> None:
    failure = classify(outcome_of(sample))
    assert failure is not None
    assert failure.cls is cls
    assert in_reason in failure.reason
    assert "\x1b" not in failure.reason and "\n" not in failure.reason


@pytest.mark.parametrize(
    "sample",
    [
        "01_tool_call",
        "02_continue_session",
        "12_multi_tool",
        "16a_external_dir_no_auto_default_perms",
    ],
)
def test_successful_samples_are_not_failures(sample: str) -> None:
    assert classify(outcome_of(sample)) is None


def test_launcher_verdicts_win() -> None:
    base = outcome_of("01_tool_call")
    stopped = classify(
        RunOutcome(
            **{**base.__dict__, "launcher_reason": "stopped", "signal": 2, "exit_code": None}
        )
    )
    assert stopped is not None and stopped.cls is FailureClass.STOPPED
    big = classify(
        RunOutcome(**{**base.__dict__, "launcher_reason": "output_too_large", "signal": 9})
    )
    assert big is not None and big.cls is FailureClass.OUTPUT_TOO_LARGE and "8 MiB" in big.reason
    for hit, said in (
        ("process_limit", "turn_limits.max_processes"),
        ("memory_limit", "turn_limits.memory_mb"),
        ("shm_full", "/dev/shm"),
    ):
        limited = classify(RunOutcome(**{**base.__dict__, "launcher_reason": hit, "signal": 9}))
        assert limited is not None and limited.cls is FailureClass.RESOURCE_LIMIT, hit
        assert said in limited.reason and blames_content(limited), limited


def test_crash_without_error_event() -> None:
    f = classify(
        RunOutcome(
            exit_code=None,
            signal=11,
            launcher_reason=None,
            last_error=None,
            stdout_empty=False,
            stderr_tail="some log\n\x1b[91mError: \x1b[0mboom happened\n",
        )
    )
    assert f is not None and f.cls is FailureClass.PROCESS_CRASHED
    assert f.reason == "OpenCode was killed by signal 11: Error: boom happened"
    f = classify(RunOutcome(3, None, None, None, True, ""))
    assert f is not None and f.reason == "OpenCode exited with code 3 with no error message"


def test_session_not_found_needs_empty_stdout() -> None:
    o = outcome_of("03_session_not_found", stdout_empty=False)
    f = classify(o)
    assert f is not None and f.cls is FailureClass.PROCESS_CRASHED


def test_rate_limit_by_message_without_429() -> None:
    ev = EngineEvent(
        "error",
        "t",
        {"name": "APIError", "message": "Rate limit exceeded, slow down"},
        facts={"status_code": 400},
    )
    f = classify(RunOutcome(1, None, None, ev, False, ""))
    assert f is not None and f.cls is FailureClass.RATE_LIMITED


def test_other_error_names_are_engine_errors() -> None:
    ev = EngineEvent("error", "t", {"name": "UnknownError", "message": "Unexpected server error."})
    f = classify(RunOutcome(1, None, None, ev, False, "nothing useful"))
    assert f is not None and f.cls is FailureClass.ENGINE_ERROR
    assert f.reason == "OpenCode reported UnknownError: Unexpected server error."


def test_reasons_are_redacted_and_short() -> None:
    agent_dir = "/home/u/.crew/agents/1234-abcd"
    token = "tok_SECRET_abcdefgh"
    ev = EngineEvent(
        "error",
        "t",
        {
            "name": "APIError",
            "message": f"bad key {token} reading {agent_dir}/work/x " + "z" * 2000,
        },
        facts={"status_code": 401},
    )
    f = classify(RunOutcome(1, None, None, ev, False, ""), secrets=[agent_dir, token, "ab"])
    assert f is not None
    assert token not in f.reason and agent_dir not in f.reason
    assert "<redacted>/work/x" in f.reason
    assert len(f.reason) <= 500


def test_redact_prefers_longest() -> None:
    assert redact("/a/bcd/efg and /a/bcd", ["/a/bcd", "/a/bcd/efg"]) == "<redacted> and <redacted>"
    assert redact("a b", ["a"]) == "a b"


def _real_setup_failure(argv: list[str]) -> RunOutcome:
    """What the launcher reports when the sandbox tool itself fails: its real exit and stderr."""
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode != 0 and not done.stdout, done
    return RunOutcome(done.returncode, None, None, None, True, done.stderr)


def test_bwrap_failing_at_run_start_is_a_sandbox_failure(tmp_path: Path) -> None:
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        required_in_ci("bubblewrap (apt-get install bubblewrap)")
        return
    missing = tmp_path / "agents" / "a1" / "work"
    outcome = _real_setup_failure([bwrap, "--ro-bind", str(missing), "/mnt", "true"])
    failure = classify(outcome, [str(tmp_path)])
    assert failure is not None and failure.cls is FailureClass.SANDBOX, failure
    assert "bwrap: Can't find source path <redacted>/agents/a1/work" in failure.reason
    assert str(tmp_path) not in failure.reason


def test_the_landlock_helper_failing_at_run_start_is_a_sandbox_failure(tmp_path: Path) -> None:
    helper = Path(sandbox_launcher.__file__).with_name("landlock_exec.py")
    argv = [sys.executable, "-I", "-S", str(helper), "--ro", str(tmp_path / "gone")]
    outcome = _real_setup_failure([*argv, "--deny", str(tmp_path), "--", "true"])
    assert outcome.exit_code == 126
    failure = classify(outcome, [str(tmp_path)])
    assert failure is not None and failure.cls is FailureClass.SANDBOX, failure
    assert "crew-landlock: cannot open allowed path" in failure.reason
    assert "the command was not started" in failure.reason


def test_a_run_cgroup_that_cannot_be_joined_is_a_sandbox_failure(tmp_path: Path) -> None:
    group = RunCgroup(1, tmp_path / "gone", tmp_path / "gone")
    outcome = _real_setup_failure([*group.join_prefix(), "true"])
    failure = classify(outcome, [str(tmp_path)])
    assert failure is not None and failure.cls is FailureClass.SANDBOX, failure
    assert "crew-cgroup: cannot join the run's cgroup" in failure.reason


def test_opencode_printing_bwrap_like_text_after_output_is_not_a_sandbox_failure() -> None:
    # Only a run that printed nothing can have failed before OpenCode started.
    outcome = RunOutcome(1, None, None, None, False, "bwrap: something a tool printed\n")
    failure = classify(outcome)
    assert failure is not None and failure.cls is FailureClass.PROCESS_CRASHED


@pytest.mark.parametrize("model", ["gpt-4o", "", "anthropic/", "/claude", "a b/c", "x" * 300])
def test_a_model_id_without_provider_is_model_unavailable_with_how_to_pick_one(
    model: str,
) -> None:
    failure = model_id_failure(model)
    assert failure is not None and failure.cls is FailureClass.MODEL_UNAVAILABLE
    assert "provider/model" in failure.reason and "opencode models" in failure.reason
    assert len(failure.reason) <= 500


@pytest.mark.parametrize("model", ["anthropic/claude-sonnet-4-5", "local/qwen2.5:7b", "a/b/c"])
def test_provider_model_ids_pass(model: str) -> None:
    assert model_id_failure(model) is None
