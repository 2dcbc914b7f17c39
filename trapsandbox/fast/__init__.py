"""
The fast paths, and every place the gateway reaches into Autobahn's and Twisted's
internals, each with its why and a test that fails when the library moves.

    ``front``     what listens: one look at a connection's first bytes
    ``fasthttp``  ``POST /computers/{id}/requests`` read off the socket
    ``compat``    the patches and the frame fast path (``WholeFrames``)
"""
