"""
Operating the gateway.

    ``metrics``        Prometheus metrics on the gateway's own registry
    ``logs``           journald and JSON log observers (``twistd --logger``)
    ``systemd``        sd_notify: ready, stopping, watchdog
    ``ctl``            ``trapsandbox-ctl``, the operator's command line: its options and
                       ``main``; each group of commands below registers its own
    ``ctl_http``       what the commands share: ``call`` (the operator HTTP API), ``Failed``,
                       the token, how an error answer reads
    ``ctl_computers``  computers, ping, request, exec, eval, screen, attach, peripherals, call
    ``ctl_files``      ls, cat, put, get, rm: a computer's files
    ``ctl_snapshots``  snapshots, snapshot, changes, restore (SPEC §15)
    ``ctl_accounts``   accounts add, list, remove: the accounts file, no gateway needed
    ``ctl_ops``        health, batch, opencode-config, datapack: the gateway as a whole
    ``batch``          ``trapsandbox-ctl batch``: NDJSON requests over one ``/operator``
    ``attach``         ``trapsandbox-ctl attach``: a computer's live screen, keys forwarded
"""
