"""trapsandbox: a request/reply gateway between CraftOS computers and a sandbox host."""

__version__ = "0.1.0"
