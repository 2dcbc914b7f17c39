"""
Settings, from the environment and the twistd plugin's options (options win).

Every bad value is a ``ConfigError`` whose message names the setting, so the
daemon can stop at start with one clear line.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import attrs
from hyperlink import URL

from trapsandbox import limits
from trapsandbox.admission import accounts as accounts_module
from trapsandbox.admission import proxies
from trapsandbox.errors import ConfigError
from trapsandbox.limits import (
    DEFAULT_HOST,
    DEFAULT_OPENCODE_USERNAME,
    DEFAULT_PORT,
    MAX_CONNECTIONS,
    MAX_UNAUTHENTICATED_PER_ADDRESS,
)


@attrs.frozen
class Settings:
    ports: tuple[str, ...] = (f"tcp:{DEFAULT_PORT}:interface={DEFAULT_HOST}",)
    password: str | None = attrs.field(default=None, repr=False)
    # None: operator endpoints answer loopback clients only.
    admin_token: str | None = attrs.field(default=None, repr=False)
    request_timeout: float = limits.DEFAULT_REQUEST_TIMEOUT
    # OPENCODE_URL: one opencode server's URL, or several separated by commas (``servers``);
    # empty: no agent; None (unset): the gateway runs opencode itself (``opencode.managed``):
    # SANDBOX_OPENCODE_SERVERS of SANDBOX_OPENCODE_BIN (None: opencode on PATH, else make's).
    opencode_url: str | None = None
    opencode_bin: str | None = None
    opencode_servers: int = limits.DEFAULT_OPENCODE_SERVERS
    opencode_max_rss: int = limits.OPENCODE_MAX_RSS_MB * 1024 * 1024
    opencode_username: str = DEFAULT_OPENCODE_USERNAME
    opencode_password: str | None = attrs.field(default=None, repr=False)
    max_connections: int = MAX_CONNECTIONS
    max_unauthenticated_per_address: int = MAX_UNAUTHENTICATED_PER_ADDRESS
    max_operator_sockets_per_account: int = limits.MAX_OPERATOR_SOCKETS_PER_ACCOUNT
    # SANDBOX_ACCOUNTS_FILE (SPEC §12): read again on SIGHUP.
    accounts_file: str | None = None
    # Its accounts (a ``trapsandbox.admission.accounts.Accounts``) as read at start.
    accounts: Any = attrs.field(default=None, repr=False)
    # Cluster mode (SPEC §13): None is one process on its own.
    redis_url: str | None = attrs.field(default=None, repr=False)
    cluster_refresh_interval: float = limits.CLUSTER_REFRESH_INTERVAL
    # SANDBOX_STATE_DIR: what the gateway keeps on disk; made private at start (``state``).
    state_dir: str = limits.DEFAULT_STATE_DIR
    # Where each computer's ask sessions get an opencode directory of their own (None:
    # ``ask`` in the state directory).  opencode must see the same path.
    ask_directory: str | None = None
    # Ask conversations remembered per account (SPEC §4), the least recently used dropped.
    max_ask_conversations: int = limits.MAX_ASK_CONVERSATIONS
    # opencode instances given back after this long unused, and at most this many live per
    # opencode server (``opencode.instances``).
    ask_instance_idle: float = limits.ASK_INSTANCE_IDLE
    ask_max_instances: int = limits.ASK_MAX_INSTANCES
    # Asks running at once per opencode server and per account; more wait (``opencode.queue``).
    ask_max_running: int = limits.ASK_MAX_RUNNING
    ask_max_running_per_account: int = limits.ASK_MAX_RUNNING_PER_ACCOUNT
    # SANDBOX_TRUSTED_PROXIES (SPEC §4): networks (and perhaps ``unix``) whose
    # X-Forwarded-For/Forwarded are believed; none by default.
    trusted_proxies: tuple[Any, ...] = ()
    # Snapshots (SPEC §15): kept per computer, what is kept per account, one snapshot's
    # bound (SANDBOX_SNAPSHOTS_KEEP, SANDBOX_SNAPSHOT_QUOTA_MB, SANDBOX_SNAPSHOT_MAX_MB).
    snapshots_keep: int = limits.SNAPSHOTS_KEEP
    snapshot_quota_bytes: int = limits.SNAPSHOT_QUOTA_BYTES
    snapshot_max_bytes: int = limits.SNAPSHOT_MAX_BYTES

    @property
    def opencode_urls(self) -> tuple[str, ...]:
        """Each opencode server's URL, in the order given (none when OPENCODE_URL is empty,
        or unset: the gateway's own then, ``opencode.managed``)."""
        return _urls(self.opencode_url or "")

    @property
    def managed(self) -> bool:
        """Whether the gateway runs opencode itself (OPENCODE_URL unset)."""
        return self.opencode_url is None

    def snapshot_store_settings(self) -> dict[str, int]:
        """What a snapshot store is opened with (``SnapshotStore``'s keyword arguments)."""
        return {
            "keep": self.snapshots_keep,
            "quota": self.snapshot_quota_bytes,
            "max_bytes": self.snapshot_max_bytes,
        }


def _escape(host: str) -> str:
    # Colons separate endpoint arguments; an IPv6 address needs them escaped.
    return host.replace("\\", "\\\\").replace(":", "\\:")


def _port(value: str, name: str) -> int:
    try:
        port = int(value, 10)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise ConfigError(f"{name} must be a port number from 0 to 65535, not {value!r}")
    return port


def _count(value: str, name: str) -> int:
    try:
        count = int(value, 10)
    except ValueError:
        count = 0
    if count < 1:
        raise ConfigError(f"{name} must be a whole number of at least 1, not {value!r}")
    return count


def _timeout_ms(value: str, name: str) -> float:
    try:
        ms = float(value)
    except ValueError:
        ms = math.nan
    if not (ms > 0 and math.isfinite(ms)):
        raise ConfigError(f"{name} must be a positive number of milliseconds, not {value!r}")
    return ms / 1000


def _megabytes(value: str, name: str) -> int:
    """A size in MiB (``0.5`` allowed), as bytes."""
    try:
        size = float(value)
    except ValueError:
        size = math.nan
    if not (math.isfinite(size) and size * 1024 * 1024 >= 1):
        raise ConfigError(f"{name} must be a positive number of MiB (e.g. 4 or 0.5), not {value!r}")
    return int(size * 1024 * 1024)


def _urls(value: str) -> tuple[str, ...]:
    return tuple(url for url in value.replace(",", " ").split() if url)


def _opencode_urls(value: str, name: str) -> str:
    """One URL or several (comma- or space-separated), each checked; kept comma-separated."""
    urls = _urls(value)
    if not urls:
        return ""  # probes then answer "OPENCODE_URL not set"
    for url in urls:
        _opencode_url(url, name)
    if len(set(urls)) != len(urls):
        raise ConfigError(f"{name} names the same opencode server twice")
    return ",".join(urls)


def _opencode_url(value: str, name: str) -> str:
    if value == "":
        return value  # probes then answer "OPENCODE_URL not set"
    try:
        url = URL.from_text(value)
    except (ValueError, TypeError):
        url = None
    if url is None or url.scheme not in ("http", "https") or not url.host:
        raise ConfigError(f"{name} must be an http:// or https:// URL, not {value!r}")
    if url.userinfo:
        # Not echoed: it holds a password.
        raise ConfigError(
            f"{name} must not carry user:password@; set OPENCODE_SERVER_USERNAME and "
            "OPENCODE_SERVER_PASSWORD instead"
        )
    return value


def _redis_url(value: str, name: str) -> str | None:
    if value == "":
        return None
    try:
        url = URL.from_text(value)
        port = url.port
        db = url.path[0] if url.path and url.path[0] else "0"
        valid = url.scheme == "redis" and bool(url.host) and db.isdigit() and len(url.path) <= 1
    except (ValueError, TypeError):
        valid = False
    if not valid or port is None:
        # Not echoed: it may hold a password.
        raise ConfigError(f"{name} must be a URL redis://[:PASSWORD@]HOST[:PORT][/DB]")
    try:
        import txredisapi  # noqa: F401  (cluster mode's one extra dependency)
    except ImportError:
        raise ConfigError(
            f"{name} asks for cluster mode, which needs txredisapi: "
            "pip install 'trapsandbox[cluster]'"
        ) from None
    return value


def _directory(value: str, name: str) -> str:
    if not value or "\0" in value:
        raise ConfigError(f"{name} must be a directory path, not {value!r}")
    return value


def _read_secret(path: str, name: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            secret = f.read()
    except (OSError, UnicodeDecodeError) as error:
        reason = getattr(error, "strerror", None) or str(error)
        raise ConfigError(f"{name}: cannot read {path}: {reason}") from None
    secret = secret.rstrip("\r\n")
    if not secret:
        raise ConfigError(f"{name}: {path} is empty")
    return secret


def _password(value: str, name: str) -> str:
    # An empty password would let anyone in while looking configured.
    if not value:
        raise ConfigError(f"{name} is empty: unset it to turn auth off")
    return value


def _admin_token(value: str, name: str) -> str:
    # It travels in an HTTP header and is typed into shells: keep it plain.
    if not value:
        raise ConfigError(f"{name} is empty: unset it to serve operators on loopback only")
    if not all("\x21" <= char <= "\x7e" for char in value):
        raise ConfigError(f"{name} must be printable ASCII without spaces")
    return value


def _program(value: str, name: str) -> str | None:
    return value.strip() or None


def _trusted_proxies(value: str, name: str) -> tuple[Any, ...]:
    try:
        return proxies.parse(value)
    except ValueError as error:
        raise ConfigError(
            f"{name} must be comma-separated addresses or CIDRs (or unix): {error}"
        ) from None


def load(environ: Mapping[str, str], options: Mapping[str, Any] | None = None) -> Settings:
    """
    Build ``Settings`` from ``environ`` and twistd ``options`` (keys as in
    ``trapsandbox.tap.Options``; None or absent means "not given").
    """
    options = options or {}

    def given(option: str, variable: str | None = None) -> tuple[str, str] | None:
        if options.get(option) is not None:
            return options[option], f"--{option}"
        if variable is not None and variable in environ:
            return environ[variable], variable
        return None

    ports = tuple(options.get("port") or ())
    if not ports:
        host = environ.get("SANDBOX_HOST", DEFAULT_HOST) or DEFAULT_HOST
        port = DEFAULT_PORT
        if "SANDBOX_PORT" in environ:
            port = _port(environ["SANDBOX_PORT"], "SANDBOX_PORT")
        ports = (f"tcp:{port}:interface={_escape(host)}",)

    def setting(option: str, variable: str, parse: Callable[[str, str], Any], default: Any):
        found = given(option, variable)
        return default if found is None else parse(*found)

    def secret(option: str, variable: str, check: Callable[[str, str], str]) -> str | None:
        """A secret given as ``--OPTION-file``/``VARIABLE_FILE`` (which win) or directly."""
        if (found := given(f"{option}-file", f"{variable}_FILE")) is not None:
            return check(_read_secret(*found), found[1])
        return setting(option, variable, check, None)

    username = DEFAULT_OPENCODE_USERNAME
    for variable in ("OPENCODE_USERNAME", "OPENCODE_SERVER_USERNAME"):
        if (found := given("opencode-username", variable)) is not None and found[0]:
            username = found[0]

    accounts_file = accounts = None
    if (found := given("accounts-file", "SANDBOX_ACCOUNTS_FILE")) is not None:
        accounts_file, name = found
        if not accounts_file:
            raise ConfigError(f"{name} is empty: unset it to have no accounts file")
        accounts = accounts_module.load(accounts_file, name)

    ask_max_instances = setting(
        "ask-max-instances", "SANDBOX_ASK_MAX_INSTANCES", _count, limits.ASK_MAX_INSTANCES
    )
    ask_max_running = setting(
        "ask-max-running", "SANDBOX_ASK_MAX_RUNNING", _count, limits.ASK_MAX_RUNNING
    )
    if ask_max_running > ask_max_instances:
        # Every running ask holds an instance: more running than live would break the bound.
        raise ConfigError(
            f"SANDBOX_ASK_MAX_RUNNING ({ask_max_running}) must not exceed "
            f"SANDBOX_ASK_MAX_INSTANCES ({ask_max_instances}): each running ask keeps an "
            "opencode instance"
        )

    return Settings(
        ports=ports,
        accounts_file=accounts_file,
        accounts=accounts,
        password=secret("password", "SANDBOX_PASSWORD", _password),
        admin_token=secret("admin-token", "SANDBOX_ADMIN_TOKEN", _admin_token),
        request_timeout=setting(
            "request-timeout-ms",
            "SANDBOX_REQUEST_TIMEOUT_MS",
            _timeout_ms,
            limits.DEFAULT_REQUEST_TIMEOUT,
        ),
        opencode_url=setting("opencode-url", "OPENCODE_URL", _opencode_urls, None),
        opencode_bin=setting("opencode-bin", "SANDBOX_OPENCODE_BIN", _program, None),
        opencode_servers=setting(
            "opencode-servers", "SANDBOX_OPENCODE_SERVERS", _count, limits.DEFAULT_OPENCODE_SERVERS
        ),
        opencode_max_rss=setting(
            "opencode-max-rss-mb",
            "SANDBOX_OPENCODE_MAX_RSS_MB",
            lambda value, name: _count(value, name) * 1024 * 1024,
            limits.OPENCODE_MAX_RSS_MB * 1024 * 1024,
        ),
        opencode_username=username,
        opencode_password=setting(
            "opencode-password", "OPENCODE_SERVER_PASSWORD", lambda value, _: value or None, None
        ),
        max_connections=setting(
            "max-connections", "SANDBOX_MAX_CONNECTIONS", _count, MAX_CONNECTIONS
        ),
        max_unauthenticated_per_address=setting(
            "max-unauthenticated-per-address",
            "SANDBOX_MAX_UNAUTHENTICATED_PER_ADDRESS",
            _count,
            MAX_UNAUTHENTICATED_PER_ADDRESS,
        ),
        max_operator_sockets_per_account=setting(
            "max-operator-sockets-per-account",
            "SANDBOX_MAX_OPERATOR_SOCKETS_PER_ACCOUNT",
            _count,
            limits.MAX_OPERATOR_SOCKETS_PER_ACCOUNT,
        ),
        redis_url=setting("redis", "SANDBOX_REDIS_URL", _redis_url, None),
        cluster_refresh_interval=setting(
            "redis-refresh-ms",
            "SANDBOX_REDIS_REFRESH_MS",
            _timeout_ms,
            limits.CLUSTER_REFRESH_INTERVAL,
        ),
        ask_directory=setting("ask-dir", "SANDBOX_ASK_DIR", lambda value, _: value or None, None),
        state_dir=setting("state-dir", "SANDBOX_STATE_DIR", _directory, limits.DEFAULT_STATE_DIR),
        max_ask_conversations=setting(
            "max-ask-conversations",
            "SANDBOX_MAX_ASK_CONVERSATIONS",
            _count,
            limits.MAX_ASK_CONVERSATIONS,
        ),
        ask_instance_idle=setting(
            "ask-instance-idle-ms",
            "SANDBOX_ASK_INSTANCE_IDLE_MS",
            _timeout_ms,
            limits.ASK_INSTANCE_IDLE,
        ),
        ask_max_instances=ask_max_instances,
        ask_max_running=ask_max_running,
        ask_max_running_per_account=setting(
            "ask-max-running-per-account",
            "SANDBOX_ASK_MAX_RUNNING_PER_ACCOUNT",
            _count,
            limits.ASK_MAX_RUNNING_PER_ACCOUNT,
        ),
        trusted_proxies=setting("trusted-proxies", "SANDBOX_TRUSTED_PROXIES", _trusted_proxies, ()),
        snapshots_keep=setting(
            "snapshots-keep", "SANDBOX_SNAPSHOTS_KEEP", _count, limits.SNAPSHOTS_KEEP
        ),
        snapshot_quota_bytes=setting(
            "snapshot-quota-mb",
            "SANDBOX_SNAPSHOT_QUOTA_MB",
            _megabytes,
            limits.SNAPSHOT_QUOTA_BYTES,
        ),
        snapshot_max_bytes=setting(
            "snapshot-max-mb", "SANDBOX_SNAPSHOT_MAX_MB", _megabytes, limits.SNAPSHOT_MAX_BYTES
        ),
    )


# -- The fast paths (``trapsandbox.fast.paths``) -------------------------------------------------


def fast_paths(environ: Mapping[str, str], options: Mapping[str, Any] | None = None) -> bool:
    """
    Whether the gateway runs its fast paths (``SANDBOX_FAST_PATHS``, ``1`` by
    default) or Twisted, Klein and Autobahn as they ship (``0``, or twistd's
    ``--plain``, which wins).
    """
    if (options or {}).get("plain"):
        return False
    value = environ.get("SANDBOX_FAST_PATHS", "1")
    if value not in ("0", "1"):
        raise ConfigError(f"SANDBOX_FAST_PATHS must be 1 (the default) or 0, not {value!r}")
    return value == "1"


def fast_paths_without(environ: Mapping[str, str]) -> tuple[str, ...]:
    """
    The fast paths left out (``SANDBOX_FAST_PATHS_WITHOUT``, comma-separated
    names of ``fast.paths.PARTS``): for the benchmark's attribution of a gain.
    """
    value = environ.get("SANDBOX_FAST_PATHS_WITHOUT", "")
    return tuple(part.strip() for part in value.split(",") if part.strip())
