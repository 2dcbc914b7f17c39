"""
The speed layer, installed on purpose (``paths.install``, from ``tap.makeService``;
never at import), and the few reaches into the libraries both modes need.

    ``paths``      ``install``/``uninstall`` and what fast mode serves with; the
                   switch is ``SANDBOX_FAST_PATHS=0`` / ``--plain`` (``config.fast_paths``)
    ``front``      what listens in fast mode: one look at a connection's first bytes
    ``fasthttp``   ``POST /computers/{id}/requests`` read off the socket
    ``protocols``  both WebSocket protocols with the frame fast path and slots
    ``compat``     the speed patches of Autobahn and Twisted, and ``WholeFrames``
    ``fixes``      correctness, in both modes: mixins and calls on library internals
"""
