"""The model gateway: the only place the user's model credentials are used (issue 23).

Each agent's engine reaches its provider through a listener of this package on
the host's 127.0.0.1 (one port per agent, forwarded into that agent's sandbox
alone) with a placeholder credential; the gateway puts in the real one and
forwards to the provider's real base URL. Modules: `access` (an agent's port
and placeholder), `upstream` (a provider's real base URL), `logins` (an API
key), `oauth` (an OAuth login refreshed here), `engine_view` (what the engine
is given instead of the user's files), `usage` (what passes, counted),
`forward` (one agent's HTTP app), `gateway` (the listeners and their routes).
"""
