"""
What both modes need of the libraries beyond their public API, in one home (the speed layer,
``trapsandbox.fast``, imports from here, never the other way).

    ``fixes``      correctness: mixins and calls on Autobahn's and Twisted's internals,
                   each pinned by ``tests/unit/compat/test_fixes.py``
    ``rawhttp``    a whole HTTP/1.1 response written as bytes (the listener's refusals,
                   the site's own closes, the fast paths' hot route)
"""
