"""
``ConfigError``: a setting with a bad value.  Raised wherever a setting is
read (``config``, the accounts file, the state directory, a ``--port``) and
turned into one line at start by ``tap``; its own module so that each of
them imports it without importing the others.
"""


class ConfigError(ValueError):
    """A setting has a bad value; the message names the setting."""
