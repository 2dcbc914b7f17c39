"""
The gateway's state directory (``SANDBOX_STATE_DIR``, SPEC §5) and the private
directories and files it keeps there (ask directories, SPEC §11).

What the gateway writes to disk can hold secrets (an ask directory's
``opencode.json`` holds that computer's MCP token), so none of it lives where
another local user can plant or read anything:

- the state directory and the ask directory are prepared at start
  (``prepare``): created with mode 0700 when missing; an existing one of ours is
  made 0700 (a ``mkdir state`` left it 0755, say); another user's is refused,
  and the daemon stops with one line naming the setting.  The path itself may
  be a symbolic link (systemd's ``DynamicUser=`` makes ``/var/lib/NAME`` one):
  the directory it leads to is what is checked.
- a directory inside them (``private_directory``) is created by the gateway
  itself with mode 0700; one that already exists is refused when it belongs to
  another user or is writable by group or others, and it is never reached
  through a symbolic link (``O_NOFOLLOW`` relative to its parent's descriptor).
- a file in such a directory (``write_private``) is opened relative to the
  directory's descriptor with ``O_NOFOLLOW``, so a planted symbolic link fails
  the write instead of redirecting it; it is truncated only once it is known to
  be a regular file of ours with one link, so a planted hard link is refused
  untouched.  Mode 0600.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator

from twisted.logger import Logger

from trapsandbox.errors import ConfigError

log = Logger()

PRIVATE_MODE = 0o700
FILE_MODE = 0o600


class Unsafe(Exception):
    """A directory or file the gateway must not use; the message says which and why."""


def prepare(path: str, setting: str) -> str:
    """
    ``path`` (relative: to the working directory) made a private directory of
    ours at start; returns its absolute path.  A ``ConfigError`` naming
    ``setting`` when it cannot be made or belongs to another user.
    """
    path = os.path.abspath(path)
    try:
        # Missing parents are made too (with the umask's mode: only the last one is ours).
        os.makedirs(path, mode=PRIVATE_MODE, exist_ok=True)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as error:
        reason = _reason(error)
        raise ConfigError(f"{setting}: cannot make the directory {path}: {reason}") from None
    try:
        status = os.fstat(fd)
        if status.st_uid != os.geteuid():
            raise ConfigError(
                f"{setting}: {path} belongs to another user (uid {status.st_uid}, the gateway "
                f"runs as uid {os.geteuid()}): give it a directory of its own"
            )
        mode = stat.S_IMODE(status.st_mode)
        if mode != PRIVATE_MODE:
            os.fchmod(fd, PRIVATE_MODE)
            log.info(
                "{setting}: {path} was mode {mode:04o}; made 0700",
                setting=setting,
                path=path,
                mode=mode,
            )
    finally:
        os.close(fd)
    return path


@contextlib.contextmanager
def private_directory(parent: str, name: str) -> Iterator[int]:
    """
    A descriptor of the directory ``name`` in ``parent``, made with mode 0700
    when missing.  ``Unsafe`` when ``name`` is not one plain name, when it is a
    symbolic link or not a directory, or when it exists owned by another user
    or writable by group or others.  ``OSError`` when it cannot be made.
    """
    if name in ("", ".", "..") or "/" in name or "\0" in name:
        raise Unsafe(f"{name!r} is not a plain directory name")
    path = os.path.join(parent, name)
    root = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, PRIVATE_MODE, dir_fd=root)
        try:
            fd = os.open(
                name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=root
            )
        except OSError as error:
            raise Unsafe(f"{path}: {_reason(error)}: refused") from None
    finally:
        os.close(root)
    try:
        status = os.fstat(fd)
        if status.st_uid != os.geteuid():
            raise Unsafe(f"{path} belongs to another user (uid {status.st_uid}): refused")
        if status.st_mode & 0o022:
            mode = stat.S_IMODE(status.st_mode)
            raise Unsafe(f"{path} is writable by group or others (mode {mode:04o}): refused")
        yield fd
    finally:
        os.close(fd)


def write_private(directory: int, name: str, data: bytes) -> None:
    """
    Write ``data`` as the file ``name`` of the directory open as ``directory``
    (mode 0600); ``Unsafe`` when ``name`` is a symbolic link or anything but a
    regular file of ours with a single link — left as it was.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(name, flags, FILE_MODE, dir_fd=directory)
    except OSError as error:
        raise Unsafe(f"{name}: {_reason(error)}: refused") from None
    with open(fd, "wb") as f:
        status = os.fstat(fd)
        if (
            not stat.S_ISREG(status.st_mode)
            or status.st_nlink != 1
            or status.st_uid != os.geteuid()
        ):
            raise Unsafe(f"{name} is not a regular file of the gateway's own: refused")
        os.fchmod(fd, FILE_MODE)
        f.truncate(0)
        f.write(data)


def _reason(error: OSError) -> str:
    # O_NOFOLLOW meeting a symbolic link fails with ELOOP (strerror: "too many levels of
    # symbolic links"), or with ENOTDIR under O_DIRECTORY.
    if error.errno == errno.ELOOP:
        return "a symbolic link"
    if error.errno == errno.ENOTDIR:
        return "a symbolic link or not a directory"
    return error.strerror or str(error)
