"""
The suite, by layer:

- ``unit/``: one module's rules in memory (injected clocks, fakes, no sockets);
- ``loopback/``: the gateway in this process on 127.0.0.1:0, with real WebSocket and HTTP clients;
- ``process/``: real processes (twistd, systemd tools, opencode, trapsandbox-ctl, the benchmark);
- ``lua/``: the Lua client on real Lua 5.2, alone and in the CraftOS harness against a gateway;
- ``harness/``: what the tests share (the CraftOS emulator, fakes, fake servers, process helpers).
"""
