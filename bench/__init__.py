"""
``make bench``: the load benchmark of the trapsandbox gateway.

``python -m bench`` starts, for each scenario, the real ``twistd trapsandbox``
gateway and a bare Autobahn echo server (:mod:`bench.bare`) pinned to one CPU,
a fake opencode (:mod:`bench.fakeopencode`) and the load generator
(:mod:`bench.load`, asyncio on uvloop with the picows WebSocket client) pinned
to the other, over 127.0.0.1 only; it prints a table with the gateway / bare
ratios and writes the figures as JSON.  See ``docs/benchmarks.md``.
"""
