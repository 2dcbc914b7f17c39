"""
The speed layer, installed on purpose (``paths.install``, from ``tap.makeService``;
never at import). It only adds speed: nothing outside it imports it (the plain gateway runs
with it deleted, ``tests/process/test_plain_alone.py``), and what both modes need is
``trapsandbox.compat``'s.

    ``paths``      ``install``/``uninstall`` and what fast mode serves with; the
                   switch is ``SANDBOX_FAST_PATHS=0`` / ``--plain`` (``config.fast_paths``)
    ``front``      what listens in fast mode: one look at a connection's first bytes
    ``fasthttp``   ``POST /computers/{id}/requests`` read off the socket
    ``protocols``  both WebSocket protocols with the frame fast path and slots
    ``patches``    the speed patches of Autobahn and Twisted, and ``WholeFrames``
"""
