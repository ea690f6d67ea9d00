"""The errors tformer raises on purpose about what a user gave it.

The CLI prints these as one line (``tformer CMD: error: ...``) and exits 2; anything else is
a bug, and gets a traceback. ValueError is the library's error for a bad value, file content
or option; the file-system errors name the path the user gave.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import numpy as np


class NamedError(Exception):
    """An error about one named field or option: ``field`` (its name where it is checked) and
    ``detail`` (what was expected and what came); the message is "field: detail". A caller that
    knows the field by another name (a command's --flag, a file's key) says it with ``named``,
    never by parsing the message."""

    def __init__(self, field: str, detail: str) -> None:
        super().__init__(f"{field}: {detail}")
        self.field, self.detail = field, detail

    def named(self, name: str):
        """The same error with the field called ``name`` (raise it ``from None``); a subclass
        keeps its type whatever its constructor takes."""
        message = f"{name}: {self.detail}"
        renamed = type(self).__new__(type(self), message)  # (not its __init__: a subclass's differs)
        renamed.__dict__.update(self.__dict__)
        renamed.field, renamed.args = name, (message,)
        return renamed


class FieldError(NamedError, ValueError):
    """A bad value of a named field or option (a config's, a command's, a file's)."""


class BadType(NamedError, TypeError):
    """A value of the wrong type in something the user wrote (a config file, an option)."""


class FieldNotFound(NamedError, FileNotFoundError):
    """A path a named field or option gave that is not there."""


class FieldNotADirectory(NamedError, NotADirectoryError):
    """A path a named field or option gave that is a file where a directory is expected."""


def shown(text: str, width: int = 60) -> str:
    """`text` quoted for an error message, cut past `width` characters: one line of a file
    may be megabytes, and the message stays one readable line."""
    return repr(text) if len(text) <= width else f"{text[:width]!r}... ({len(text):,} characters)"


def as_path(value: object, name: str, what: str = "a path") -> Path:
    """``value`` (a str or os.PathLike) as a Path, refused in one line naming ``name``: a number
    or bytes was pathlib's bare TypeError, and "" became ".", the current folder."""
    if isinstance(value, bytes | bytearray) or not isinstance(value, str | os.PathLike):
        raise BadType(name, f"expected {what} (str or os.PathLike), got {type(value).__name__}")
    if not str(value):  # Path("") is "."
        raise FieldError(name, f"expected {what}, got ''")
    return Path(value)


class BadInput(ValueError):
    """One of the texts given to a run (``run.generate([...])``, ``tformer generate``) cannot be
    read by its model; ``index`` says which, so a command can name the argument or FILE:LINE."""

    def __init__(self, index: int, reason: str) -> None:
        super().__init__(f"inputs[{index}]: {reason}")
        self.index, self.reason = index, reason


class MissingExtra(ImportError):
    """An optional dependency is not installed; the message names the extra that installs it."""


def check_flag(name: str, value: object, none: bool = False) -> None:
    """True or False (or None where ``none``); a numpy bool too. A str such as "no" is truthy,
    and was taken as yes (``allow_pickle="no"`` let a pickle in)."""
    if not (isinstance(value, bool | np.bool_) or (none and value is None)):
        raise TypeError(f"{name}: expected True or False{' or None' if none else ''}, got {value!r}")


def require(module: str, extra: str, purpose: str) -> ModuleType:
    """Import an optional dependency, or raise MissingExtra naming the extra."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingExtra(
            f"{purpose} needs the optional package {module.split('.')[0]}: "
            f"pip install 'tformer[{extra}]'"
        ) from None


class Terminated(KeyboardInterrupt):
    """SIGTERM (`kill`, `timeout`, a job scheduler) taken as a Ctrl-C: the same safe stop, the same
    word on how to go on; the command line then exits 143 (128 + 15), as the signal's default would."""


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """Within the block SIGTERM raises Terminated where Ctrl-C would raise KeyboardInterrupt (in
    the main thread, between two bytecodes); the handler before it comes back after."""
    if threading.current_thread() is not threading.main_thread():  # only there can one be set
        yield
        return

    def terminated(signum, frame) -> None:
        raise Terminated

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


USER_ERRORS = (
    ValueError, BadType, MissingExtra, FileNotFoundError, FileExistsError, NotADirectoryError,
    IsADirectoryError, PermissionError,
)
# The machine refusing (a full disk, a read-only folder, permissions): one line too, exit 1.
OS_ERRORS = (OSError,)


def a(word: str) -> str:
    """``word`` with its indefinite article, for messages: "an embedding", "a seq2seq"."""
    return f"{'an' if word[:1].lower() in 'aeiou' else 'a'} {word}"
