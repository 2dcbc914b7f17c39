"""
Operating the gateway.

    ``metrics``   Prometheus metrics on the gateway's own registry
    ``logs``      journald and JSON log observers (``twistd --logger``)
    ``systemd``   sd_notify: ready, stopping, watchdog
    ``ctl``       ``trapsandbox-ctl``, the operator's command line
    ``batch``     ``trapsandbox-ctl batch``: NDJSON requests over one ``/operator``
    ``attach``    ``trapsandbox-ctl attach``: a computer's live screen, keys forwarded
"""
