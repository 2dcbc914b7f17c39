"""
Who gets in (SPEC §2 hello, §4, §12).

    ``auth``      ``Admission``: computer secrets (``Admitted``: the account and the
                  secret's hash) and operator tokens (an ``Operator``: the admin or one
                  account; ``bearer_token``), checked before any throttle; an
                  account's ``max_computers`` (``room``); which account a request
                  means (``Operator.account_of``); the browser rule
                  (``browser_refusal``, ``foreign_upgrade``); reload
    ``accounts``  the accounts file: hashes looked up by hash, and the edits
                  ``trapsandbox-ctl accounts`` makes
    ``reloading`` the accounts file read again while running (SIGHUP): who it no
                  longer admits closed
    ``throttle``  the per-address back-off of wrong secrets and tokens
    ``proxies``   the client's address behind a listed reverse proxy
    ``tally``     how many of one thing (computers, sockets, watches) each account holds
    ``strangers`` HTTP connections of each address with no request admitted yet (429
                  past the bound), counted by what listens
"""
