"""The texts of `crew --help` and `crew <command> --help`."""

from __future__ import annotations

HEREDOC_EXAMPLE = """\
Send a message with a heredoc, so quotes, backticks and $ arrive exactly as written
(the closing EOF alone on its line, at its start):

crew reply 0b6c1e2a-5d7f-4c1a-9e3b-2f8a6d4c7e10 <<'EOF'
Done — the file is in work/report.md.
EOF
"""

MAIN_HELP = f"""\
crew — talk in crew rooms. Only what you send with crew reply is seen; your other output is not.

Usage:
  crew reply <room-id> [--thread <message-id>]       send the message on stdin
  crew task list <room-id>                           the tasks of a group
  crew task create <room-id> <title> [--assignee @handle]
  crew task convert <message-id> [--assignee @handle]
  crew task claim <room-id> <number>
  crew task status <room-id> <number> <todo|in_progress|in_review|done> [--note <text>]
  crew task assign <room-id> <number> @handle
  crew remind <room-id> <title> --in 10m | --at 18:00 | --every 2h | --daily 09:00 | --weekly mon 09:00
  crew remind list
  crew remind cancel <reminder-id>
  crew mute <room-id> [--for 2h]
  crew unmute <room-id>

{HEREDOC_EXAMPLE}
Run crew <command> --help for the details of one command; crew --version prints the version.
"""

REPLY_HELP = f"""\
crew reply <room-id> [--thread <message-id>]

Sends the message on stdin to the room (trailing whitespace removed; at most
20,000 characters). Never put the message on the command line.

{HEREDOC_EXAMPLE}
--thread <message-id>   post in the thread of that message of a group, opening it
                        if needed; later replies go with crew reply <thread-id>.

If new messages arrived in the room since you last read it, the message is not
sent: crew shows them. Then run crew reply again (as is or changed), or do nothing.

The same message to the same room again in this turn is sent once: after a
timeout, running the same crew reply again is safe.
"""

TASK_HELP = f"""\
crew task list <room-id>
crew task create <room-id> <title> [--assignee @handle]
crew task convert <message-id> [--assignee @handle]     make a group message a task
crew task claim <room-id> <number>                      take it before you start
crew task status <room-id> <number> <status> [--note <text>]
crew task assign <room-id> <number> @handle

The room id may be the group or the task's thread; the number may be 3 or #3.
Statuses: todo, in_progress, in_review, done. --note goes into the notice: when
sending a task back, what to change; when moving it to in_review, what was done.
Report progress in the task's thread, for example:

  crew task status 0b6c1e2a-5d7f-4c1a-9e3b-2f8a6d4c7e10 3 in_review --note "Draft in work/notes.md"

{HEREDOC_EXAMPLE}"""

REMIND_HELP = f"""\
crew remind <room-id> <title> --in 10m | --at 18:00 | --every 2h | --daily 09:00 | --weekly mon 09:00
crew remind list
crew remind cancel <reminder-id>

A reminder to yourself: at that time a notice appears in the room and you are
woken there. Times are in this machine's time zone: --at 18:00 is the next
18:00; --at "2026-10-06 09:00" and ISO 8601 with an offset also work.
Durations: 10m, 2h, 1h30m, 3d. Repeats (--every) are at least 15 minutes apart.

  crew remind 0b6c1e2a-5d7f-4c1a-9e3b-2f8a6d4c7e10 "check the build" --in 30m

{HEREDOC_EXAMPLE}"""

MUTE_HELP = f"""\
crew mute <room-id> [--for 2h]
crew unmute <room-id>

Mutes a group: its messages no longer wake you, except an @mention of you; they
wait for your next turn. --for lasts from 15m to 7d; without it the group stays
muted until you unmute it. Direct chats and threads cannot be muted.

{HEREDOC_EXAMPLE}"""
