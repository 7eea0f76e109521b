"""Files that are never torn, never read without bound and never written by two runs at once
(a leaf module: imports nothing from hilbert_lab).

- `atomic_write(path, data)` / `atomic_writer(path)`: a file's content replaced all at once (temporary
  file, fsync, rename), with the usual permissions (umask), never a partial file.
- `append_line(handle, line)`: one whole record line appended, or none (a failed write is cut back).
- `exclusive_lock(path, what)`: the one lock that stops two runs writing the same results.
- `path_problem(path)` / `read_bounded(path, name, max_bytes)`: why a path cannot be used (dangling or
  looping link, too long, a folder, a FIFO or device), and reading a regular file of bounded size.
- `read_json_object(path, what, expected, max_bytes)`: the JSON object in a bounded regular file, or a ValueError
  naming the file and what was expected.
- `strip_paths(text)`: every absolute path in `text` cut to its file name, so that recorded results hold
  no machine's folders.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import stat
import tempfile
import threading
from pathlib import Path
from typing import IO, Any, Iterator

_UMASK_LOCK = threading.Lock()
# an absolute path (POSIX or ~): its folders are dropped, the file name kept
_ABSOLUTE_PATH = re.compile(r"(?<![\w.:/~-])(?:~|/[\w.@+-]+)(?:/[\w.@+-]+)*/([\w.@+-]+)")


def strip_paths(text: object) -> str:
    """`text` with every absolute path cut to its last part ('/root/out/x.json' -> 'x.json')."""
    return _ABSOLUTE_PATH.sub(lambda match: match.group(1), str(text))


def _umask() -> int:
    with _UMASK_LOCK:  # os.umask can only be read by setting it
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_writer(path: str | os.PathLike) -> Iterator[IO[bytes]]:
    """A binary handle whose content replaces `path` when the block ends without an exception: written to
    a temporary file in the same folder, fsynced and renamed over `path` (mode 0o666 less the umask, or
    the mode of the file it replaces). `path` holds its previous complete content or the new one, never
    a partial file, and no temporary file is left behind, whether the block succeeds or fails."""
    path = Path(path)
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            yield handle
            handle.flush()
            try:
                mode = stat.S_IMODE(os.stat(path).st_mode)
            except OSError:
                mode = 0o666 & ~_umask()
            os.fchmod(handle.fileno(), mode)
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException as error:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        if isinstance(error, OSError) and error.filename in (None, temporary) and error.errno:
            raise OSError(error.errno, error.strerror, str(path)) from None  # name the file, not its stand-in
        raise
    with contextlib.suppress(OSError):  # make the rename durable (not supported everywhere)
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)


def atomic_write(path: str | os.PathLike, data: str | bytes) -> None:
    """Write `data` (str as UTF-8, or bytes) to `path` all at once (see `atomic_writer`)."""
    if not isinstance(data, (str, bytes)):
        raise ValueError(f"data must be str or bytes, got {type(data).__name__}")
    with atomic_writer(path) as handle:
        handle.write(data.encode("utf-8") if isinstance(data, str) else data)


def append_line(handle: IO, line: str) -> None:
    """Append `line` (a newline is added) to the file open in `handle` (append mode) in whole, fsynced.
    If the write fails (a full disk, a file-size limit), the file is cut back to its previous length, so
    no torn line is left, and the OSError is raised."""
    handle.flush()
    descriptor = handle.fileno()
    before = os.lseek(descriptor, 0, os.SEEK_END)
    data = memoryview((line + "\n").encode("utf-8"))
    try:
        while data:
            data = data[os.write(descriptor, data):]
        os.fsync(descriptor)
    except OSError as error:
        with contextlib.suppress(OSError):
            os.ftruncate(descriptor, before)
        if error.filename is None and error.errno and isinstance(getattr(handle, "name", None), str):
            raise OSError(error.errno, error.strerror, handle.name) from None
        raise


class LockedError(ValueError):
    """Another process holds the lock (raised at once, never waited for)."""


@contextlib.contextmanager
def exclusive_lock(path: str | os.PathLike, what: str) -> Iterator[IO[str]]:
    """Hold an exclusive lock on `path` (opened "a+", created if missing) for the block and yield its
    handle; LockedError naming `what` at once when another process holds it. The lock goes with the
    process (flock), so a killed run never leaves a stale lock."""
    handle = open(path, "a+", encoding="utf-8")
    try:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise LockedError(f"{what} is being written by another run (locked: {str(path)!r}); wait for it "
                              "to finish or choose another path") from None
        yield handle
    finally:
        handle.close()


_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def path_problem(path: str | os.PathLike, *, folder: bool = False, must_exist: bool = True) -> str | None:
    """Why `path` cannot be used as a regular file (folder=True: as a folder), or None when it can.

    Named problems: an empty path, a NUL byte, a name or path too long, a dangling symbolic link, a
    symbolic link loop, a folder where a file is wanted (or the reverse), a FIFO, device or socket, and
    (must_exist) a missing path. Never opens the path, so it never blocks.
    """
    text = os.fspath(path)
    if isinstance(text, bytes):
        text = os.fsdecode(text)
    if not text.strip():
        return "is empty; give a path"
    if "\0" in text:
        return "contains a NUL byte"
    try:
        info = os.stat(text)
    except OSError as error:
        if error.errno == errno.ENAMETOOLONG:
            return f"is too long ({len(text)} characters, or a name over {_name_max(text)} bytes)"
        if error.errno == errno.ELOOP:
            return "is a symbolic link loop"
        if error.errno == errno.ENOTDIR:
            return "passes through a file that is not a directory"
        if error.errno == errno.ENOENT:
            if os.path.islink(text):
                return f"is a dangling symbolic link (to {os.readlink(text)!r})"
            return "does not exist" if must_exist else None
        if error.errno == errno.EACCES:
            return "cannot be accessed (permission denied)"
        return f"cannot be used ({error.strerror or error})"
    if stat.S_ISDIR(info.st_mode):
        return None if folder else "is a directory; give a file"
    for test, name in _KINDS:
        if test(info.st_mode):
            return f"is {name}, not a {'directory' if folder else 'regular file'}"
    return "is a file; give a directory" if folder else None


def _name_max(text: str) -> int:
    with contextlib.suppress(OSError, ValueError):
        return os.pathconf(os.path.dirname(os.path.abspath(text)) or "/", "PC_NAME_MAX")
    return 255


def read_bounded(path: str | os.PathLike, name: str, max_bytes: int) -> bytes:
    """The bytes of the regular file at `path`, at most `max_bytes`; ValueError naming `name` for a path
    that is not a regular file (FIFO, device, folder, dangling link...) or a larger file. The file is
    opened without blocking and checked on its descriptor, so neither a FIFO nor /dev/zero can hang it
    or fill memory."""
    problem = path_problem(path)
    if problem is not None:
        raise ValueError(f"{name} {os.fspath(path)!r} {problem}")
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as error:
        raise ValueError(f"{name} {os.fspath(path)!r} cannot be read: {error.strerror or error}") from None
    with os.fdopen(descriptor, "rb") as handle:
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"{name} {os.fspath(path)!r} is not a regular file")
        if info.st_size > max_bytes:
            raise ValueError(f"{name} {os.fspath(path)!r} has {info.st_size} bytes, more than the "
                             f"{max_bytes} allowed")
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ValueError(f"{name} {os.fspath(path)!r} has more than the {max_bytes} bytes allowed")
    return data


JSON_KINDS = {list: "an array", str: "a string", int: "a number", float: "a number", bool: "a boolean",
              type(None): "null"}  # a JSON value's kind in words


def read_json_object(path: str | os.PathLike, what: str, expected: str, max_bytes: int) -> dict[str, Any]:
    """The JSON object in the file at `path` (a regular file of at most max_bytes); ValueError naming `what` and
    the path, and saying `expected`, for a file that is not a regular file, not UTF-8 JSON, or JSON of another
    kind than an object."""
    data = read_bounded(path, what, max_bytes)
    try:
        value = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise ValueError(f"{what} {str(path)!r} is not UTF-8 text (a binary file?); expected {expected}") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"{what} {str(path)!r} is not valid JSON ({error.msg} at line {error.lineno} column "
                         f"{error.colno}); expected {expected}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{what} {str(path)!r} holds {JSON_KINDS.get(type(value), 'a value')}; expected {expected}")
    return value
