"""A cold run waiting out a provider's Retry-After, read from OpenCode's log (issue 20).

The lines are the real OpenCode 1.18.33's (`tests/samples/opencode/05_http_429RA`:
HTTP 429 with `Retry-After: 1`, six attempts, the title request's own three).
"""

from __future__ import annotations

from pathlib import Path

from computer_service.engine.events import ModelRequests, log_fields
from sandbox_launcher.engine_run import _MODEL_LOG, MAX_LOG_LINE, log_frame

SAMPLE = Path(__file__).parents[1] / "samples" / "opencode" / "05_http_429RA.stderr.txt"


def sample_lines() -> list[str]:
    return SAMPLE.read_text().splitlines()


def test_the_launcher_passes_on_exactly_the_model_request_lines() -> None:
    passed = [line for line in sample_lines() if _MODEL_LOG.search(line.encode())]
    messages = [log_fields(line)["message"] for line in passed]
    # 7 request starts (the title's, then six of the turn's), 7 failures (six + the title's).
    assert messages.count("stream") == 7 and messages.count("stream error") == 7, messages
    assert len(passed) == 14
    frame = log_frame(b"x" * (MAX_LOG_LINE * 2))
    assert len(frame) < MAX_LOG_LINE + 64


def test_log_fields_unquote_values() -> None:
    line = next(x for x in sample_lines() if 'message="stream error"' in x and "small=false" in x)
    fields = log_fields(line)
    assert fields["message"] == "stream error" and fields["small"] == "false"
    assert fields["error.error"] == "AI_APICallError: Rate limit reached (scripted)"


def test_a_failed_request_with_none_after_it_is_a_wait_a_new_one_ends_it() -> None:
    requests = ModelRequests()
    lines = [x for x in sample_lines() if _MODEL_LOG.search(x.encode())]
    now = 0.0
    waits = []
    for line in lines:
        now += 1.0
        requests.see_log(line, now)
        waits.append(requests.waiting_for(now + 10))
    # After each failure of the turn's own request: waiting; a new request: not.
    assert requests.waiting_for(now + 40) == 40.0  # the last line is a failure
    assert "Rate limit reached" in requests.error
    assert 0.0 in waits
    requests.progressed()  # a stdout line
    assert requests.waiting_for(now + 100) == 0.0


def test_the_title_requests_own_failures_do_not_count() -> None:
    requests = ModelRequests()
    title = next(x for x in sample_lines() if "stream error" in x and "small=true" in x)
    requests.see_log(title, 1.0)
    assert requests.waiting_for(100.0) == 0.0
