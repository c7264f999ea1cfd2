"""The fault list of quality.md ("Reliability and security") and where each item is tested.

This directory holds the tests that drive a fault through the whole chain
(the Computer as a real process, the real launcher and sandbox, the real
server). Faults already covered closer to their part are tested where that
part lives; this index names them all, and the test below keeps it honest:
every test it names exists.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

FAULTS: dict[str, list[str]] = {
    "a crew reply whose answer is lost, or whose server pauses past crew's 10 s: posted once": [
        "tests/faults/test_idempotent_reply.py::test_a_reply_whose_answer_is_lost_is_retried_and_posted_once",
        "tests/faults/test_idempotent_reply.py::test_a_reply_to_a_paused_server_lands_once_when_sent_again",
        "tests/server/test_idempotency.py::test_the_same_key_again_gets_the_first_answer_and_posts_once",
        "tests/faults/test_idempotent_reply.py::test_a_reply_whose_answer_is_lost_on_the_way_to_the_sandbox_answers_once_in_both_engines",
    ],
    "over PostgreSQL, two servers, the Computer's stream moved between them: answered once": [
        "tests/faults/test_once_postgres.py::test_a_lost_reply_answer_retried_on_the_other_server_answers_once",
        "tests/faults/test_once_postgres.py::test_kill_9_of_the_computer_after_crew_reply_and_the_new_one_on_the_other_server",
    ],
    "kill -9 of the launcher right after crew reply returned: the message is answered once": [
        "tests/faults/test_answered_once.py::test_kill_9_of_the_launcher_right_after_crew_reply_answers_once_in_both_engines",
    ],
    "an agent's token answer lost as the Computer starts (no event follows): its message answered": [
        "tests/faults/test_lost_token.py::test_a_lost_token_answer_at_start_still_answers_the_waiting_message",
        "tests/computer/test_service_life.py::test_an_agent_whose_token_could_not_be_issued_gets_its_runner_without_a_new_event",
    ],
    "the server's database disk full then freed mid-turn: answered once": [
        "tests/faults/test_server_full_disk.py::test_a_disk_full_then_freed_mid_turn_answers_once_in_both_engines",
    ],
    "a seeded chaos run: every fault kind, every message answered once from the database": [
        "tests/faults/test_chaos_small.py::test_a_small_chaos_run_answers_every_message_exactly_once",
        "tests/faults/test_answer_ledger.py::test_a_message_given_again_to_a_turn_that_replies_again_is_answered_twice",
    ],
    "crew-server SIGSTOPped 25 s as crew reply goes out: the late reply counts for its turn, once": [
        "tests/faults/test_paused_server.py::test_a_server_paused_25_s_as_crew_reply_goes_out_answers_once",
        "tests/server/test_turn_binding.py::test_a_reply_landing_after_its_turn_failed_attaches_to_it_and_acks",
        "tests/server/test_turn_binding.py::test_a_late_reply_once_a_newer_turn_has_the_messages_is_refused",
    ],
    "a turn identity of no turn of the agent (made up, another agent's): refused, nothing done": [
        "tests/server/test_turn_binding.py::test_a_made_up_turn_identity_is_refused_and_nothing_is_posted",
        "tests/server/test_turn_binding.py::test_another_agents_turn_identity_is_refused_and_binds_nothing",
    ],
    "kill -9 of the Computer right after crew reply returned: the message is answered once": [
        "tests/faults/test_answered_once.py::test_kill_9_of_the_computer_right_after_crew_reply_answers_once",
        "tests/faults/test_answered_once.py::test_kill_9_of_the_computer_right_after_crew_reply_answers_once_in_both_engines",
        "tests/faults/test_answered_once.py::test_kill_9_after_a_reply_that_answered_a_held_message_answers_both_once",
        "tests/server/test_answered_ack.py::test_a_turn_of_a_vanished_computer_acks_what_it_answered",
        "tests/server/test_answered_ack.py::test_a_reply_landing_after_its_turn_failed_acks_that_room",
    ],
    "kill -9 of the Computer during a turn; restart handles the messages, the turn is interrupted": [
        "tests/computer/test_process.py::test_kill_9_mid_turn_then_restart_handles_the_messages_again",
    ],
    "the server restarts during a turn: reports wait, the turn ends, the stream reconnects": [
        "tests/faults/test_server_restart.py::test_server_killed_and_restarted_mid_turn_reports_wait_nothing_lost_or_acked_twice",
        "tests/computer/test_service.py::test_server_restart_during_a_turn_loses_nothing_and_acks_once",
        "tests/computer/test_service.py::test_reconnects_after_a_server_restart_and_handles_what_came_meanwhile",
    ],
    "the launcher dies: running turns fail as process_crashed, a new launcher takes over": [
        "tests/computer/test_process.py::test_a_dead_launcher_fails_the_turn_and_is_replaced",
        "tests/launcher/test_runs.py::test_launcher_dies_with_its_parent",
        "tests/faults/test_stranded_messages.py::test_a_launcher_killed_mid_turn_leaves_no_message_unanswered",
        "tests/computer/test_parts.py::test_a_run_waits_for_the_launcher_being_replaced",
    ],
    "a storm of messages while the launcher, the server and its disk fail at random: nothing lost": [
        "tests/faults/test_storm_smoke.py::test_a_small_storm_with_a_launcher_kill_and_a_server_restart_loses_nothing",
    ],
    "a message whose turn fails every time: set aside after 3 attempts, later ones answered": [
        "tests/faults/test_poison_message.py::test_a_message_failing_every_turn_is_set_aside_and_the_later_ones_are_answered",
    ],
    "an environment failure (not logged in): the message is kept and retried by itself": [
        "tests/faults/test_poison_message.py::test_an_environment_failure_keeps_the_message_and_retries_it_by_itself",
        "tests/faults/test_stranded_messages.py::test_a_launcher_killed_mid_turn_leaves_no_message_unanswered",
    ],
    "the agent's crew reply is refused: the turn fails as reply_refused, the message comes back": [
        "tests/faults/test_reply_refused.py::test_a_reply_refused_every_time_fails_the_turn_and_the_message_comes_back",
        "tests/faults/test_reply_refused.py::test_a_refused_reply_sent_again_successfully_is_a_success",
    ],
    "the server is away mid-turn longer than a restart: the events wait and all arrive": [
        "tests/faults/test_server_outage.py::test_events_of_a_turn_wait_for_a_server_away_longer_than_a_restart",
        "tests/computer/test_reporter.py::test_events_wait_for_a_server_that_is_away_and_go_out_in_order",
    ],
    "events over the waiting bound, or a server away past the window: the lost ones are a gap": [
        "tests/computer/test_reporter.py::test_past_the_bound_the_oldest_waiting_events_are_dropped_as_a_gap",
        "tests/computer/test_reporter.py::test_at_the_end_the_rest_waits_for_the_server_only_the_flush_window",
        "tests/server/test_delivery_edges.py::test_the_event_count_at_the_end_records_a_lost_tail_as_a_gap",
    ],
    "a model answering 429 with Retry-After: 600: rate_limited at once, retried at that time": [
        "tests/e2e/test_rate_limit.py::test_a_429_with_retry_after_ends_the_turn_as_rate_limited_retried_then",
        "tests/computer_unit/test_warm_untrusted.py::test_a_retry_far_off_ends_the_turn_as_rate_limited_at_once",
        "tests/computer_unit/test_delivery_rules.py::test_a_rate_limit_with_the_providers_time_is_retried_then_not_after_5_s",
    ],
    "a warm server that refuses a permission answer, drops a prompt or never starts": [
        "tests/computer_unit/test_warm_untrusted.py::test_a_permission_answer_the_server_refuses_ends_the_turn_not_the_wall_clock",
        "tests/computer_unit/test_warm_untrusted.py::test_a_prompt_that_makes_no_progress_ends_the_turn_not_the_wall_clock",
        "tests/computer_unit/test_warm_untrusted.py::test_a_server_that_never_starts_costs_the_turns_own_limit",
    ],
    "HELD then nothing succeeds; a set-aside never marks read what a HELD answer showed": [
        "tests/e2e/test_turn_edges.py::test_held_then_nothing_is_a_succeeded_turn",
        "tests/e2e/test_turn_edges.py::test_a_message_set_aside_leaves_the_one_a_held_answer_showed_unread",
    ],
    "steady traffic in a group: a reply is held at most twice, nothing read unseen or lost": [
        "tests/faults/test_held_storm.py::test_a_reply_under_steady_traffic_is_held_at_most_twice_and_nothing_is_lost",
    ],
    "a hostile agent: ~/.ssh, ~/.bashrc, another agent's token, both sockets, signals, leftovers, links, FIFO": [
        "tests/faults/test_hostile_agent.py::test_hostile_agent_is_contained_and_the_other_agent_carries_on",
        "tests/faults/test_hostile_agent.py::test_a_planted_session_id_does_not_wedge_the_agent",
        "tests/launcher/test_hostile.py::test_hostile_engine_is_contained",
        "tests/computer/test_process.py::test_planted_file_is_that_agents_problem_a_planted_link_is_repaired_others_run",
        "tests/computer_unit/test_pipeline.py::test_a_session_that_cannot_be_saved_is_lost_and_the_next_turn_starts_anew",
        "tests/computer_unit/test_engine_sandboxed.py::test_background_process_neither_hangs_nor_outlives_the_turn",
    ],
    "a second Computer with the same token replaces the first: it exits 1 with one line, nothing lost": [
        "tests/faults/test_replaced_computer.py::test_a_computer_replaced_by_another_with_its_token_exits_and_nothing_is_lost",
    ],
    "a second Computer on the same crew home refuses before it connects": [
        "tests/faults/test_replaced_computer.py::test_a_second_computer_on_the_same_crew_home_refuses_before_it_connects",
    ],
    "the server's disk is full: 503 storage_full on the same connection, recovery when space returns": [
        "tests/faults/test_server_full_disk.py::test_a_full_disk_answers_503_keeps_the_connection_and_recovers",
        "tests/faults/test_server_full_disk.py::test_an_ack_refused_by_a_full_disk_is_read_once_space_returns",
    ],
    "the server is down for a while: the Computer reconnects within seconds of it answering again": [
        "tests/faults/test_reconnect.py::test_the_event_stream_is_back_within_seconds_of_the_server_and_a_message_is_answered",
    ],
    "an agent breaks its own home (rm -rf, links, a file where a directory belongs)": [
        "tests/computer/test_process.py::test_rm_rf_from_inside_the_sandbox_is_repaired_before_the_next_turn",
        "tests/computer/test_service_agents.py::test_an_agent_that_breaks_its_home_mid_run_is_repaired_or_told_and_healed_on_a_wake",
        "tests/computer/test_service_agents.py::test_a_failed_preparation_is_that_agents_problem_until_a_wake_prepares_it_again",
        "tests/computer_unit/test_home.py::test_repair_before_a_turn_puts_back_what_the_agent_broke",
    ],
    "the launcher is replaced by an unusable one: every agent is told, and recovers": [
        "tests/computer/test_process.py::test_an_unusable_replacement_launcher_is_every_agents_problem_until_one_is_usable",
        "tests/computer/test_service_agents.py::test_an_unusable_replacement_launcher_is_every_agents_problem_until_one_is_usable",
    ],
    "bad input: bootstrap garbage": [
        "tests/faults/test_bad_input.py::test_bootstrap_garbage_exits_1_with_one_line_and_no_token",
        "tests/computer/test_process.py::test_bootstrap_garbage_is_a_clear_error",
        "tests/computer/test_bootstrap.py::test_garbage_is_refused_clearly_without_the_token",
    ],
    "bad input: malformed SSE (and garbled answers)": [
        "tests/faults/test_bad_input.py::test_a_garbled_event_stream_is_logged_and_the_next_good_wake_handled",
        "tests/faults/test_bad_input.py::test_garbled_answers_from_the_server_are_logged_and_nothing_is_lost",
        "tests/computer/test_service.py::test_malformed_wake_events_are_recognised",
    ],
    "bad input: non-JSON and invalid UTF-8 engine lines, one line over the cap": [
        "tests/faults/test_bad_input.py::test_broken_engine_output_is_recorded_and_a_line_over_the_cap_loses_nothing",
        "tests/computer_unit/test_events.py::test_bad_lines_become_unparsed_other",
        "tests/computer_unit/test_events.py::test_any_bytes_give_a_serialisable_event",
        "tests/computer_unit/test_opencode_engine.py::test_bad_lines_are_kept_not_fatal",
        "tests/computer_unit/test_engine_sandboxed.py::test_output_cap",
        "tests/launcher/test_runs.py::test_output_over_the_cap_kills_the_run",
    ],
    "bad input: oversize or empty crew bodies": [
        "tests/faults/test_bad_input.py::test_oversize_and_empty_crew_bodies_from_the_sandbox_post_nothing",
        "tests/shim/test_reply.py::test_local_refusals_send_nothing",
    ],
    "bad input: a schema fuzz (schemathesis) of all three OpenAPI surfaces": [
        "tests/server/test_openapi.py::test_app_conforms_to_openapi",
        "tests/launcher/test_openapi.py::test_schema_fuzz",
        "tests/computer/test_introspection_schema.py::test_introspection_conforms_to_its_schema",
    ],
}


def _test_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return {
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.name.startswith("test_")
    }


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_every_fault_names_tests_that_exist(fault: str) -> None:
    tests = FAULTS[fault]
    assert tests, f"no test for: {fault}"
    for node in tests:
        file, _, name = node.partition("::")
        path = ROOT / file
        assert path.is_file(), f"{fault}: {file} does not exist"
        assert name in _test_names(path), f"{fault}: {file} has no {name}"
