"""
Who gets in (SPEC §2 hello, §4, §12).

    ``auth``      ``Admission``: computer secrets and operator tokens (an ``Operator``:
                  the admin or one account), checked before any throttle; the browser
                  rule (``browser_refusal``, ``foreign_upgrade``); reload
    ``accounts``  the accounts file: hashes looked up by hash, and the edits
                  ``trapsandbox-ctl accounts`` makes
    ``throttle``  the per-address back-off of wrong secrets and tokens
    ``proxies``   the client's address behind a listed reverse proxy
"""
