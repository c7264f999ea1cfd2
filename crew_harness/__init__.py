"""What people and tests run around the product, never the product itself.

The demo (`scripts/demo`, `python -m crew_harness.demo`), the scripted
OpenAI-compatible model it and the e2e tests talk to (`python -m
crew_harness.scripted_model`), and the two small helpers everything that drives
processes needs: waiting until something happened, and a free loopback port.
`crew_testkit` (the tests' and benchmarks' process starters) builds on this
package; no production package (`computer_service`, `sandbox_launcher`,
`crew_common`, `crew_shim`, `crew_server`) imports it, which
`tests/common/test_layers.py` checks.

- `demo`: the whole system on this machine, one agent answering one message.
- `scripted_model`: the scripted model server (`Script`, `ScriptedModel`, `scenario`).
- `waiting`: the one way to wait until something happened (sync and async).
- `ports`: a TCP port free on loopback.
"""
