"""What the tests and the benchmarks both run: process starters and stand-ins, not tests.

The benchmarks measure the same processes the tests drive (a `crew-server --dev`,
a `crew-computer`, the fake `opencode`, the scripted in-process engine) and wait
the same way. That code used to live in `tests/`, so the benchmarks imported the
test tree. It lives here instead, in an ordinary importable package: the test
tree stays a set of tests and their own support, and `benchmarks/` imports no
`tests.*`. Nothing here is used by the product itself. It builds on
`crew_harness` (waiting, free ports, the scripted model, the demo's stack), which
the demo shares with it; `crew_harness` never imports this package.

- `crew_server_proc`: a real `crew-server --dev` subprocess.
- `computer_proc`: a real `crew-computer` subprocess on a temporary machine.
- `fake_opencode`: a stand-in `opencode` executable (standard library only).
- `scripted`: `ScriptedEngine`, an in-process `Engine` run by a script.
- `rig`: runners against a real crew-server, driven by a `ScriptedEngine`.
- `storm`: a storm of messages through the real processes while faults strike.
- `chaos`: the storm with every fault kind (kill -9, SIGSTOP, disk full) and restarts.
- `answer_ledger`: how often each message was answered, read from the server's database.
"""
