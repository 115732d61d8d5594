# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE to the gpufleet.sglang collection. It may change or be removed
# at any time, in any release. Do not use it from other collections or from your own modules.

"""An SGLang server's log file: what a failure message quotes from it, and its rotation.

The excerpt: the cause (the exception line of the last traceback, else the last line that reads like an
error), and the lines that matter around it, bounded in lines and characters. A real SGLang log opens each
start with a ``server_args=...`` line of about 10,000 characters and keeps logging health checks: a plain
tail of 30 lines is mostly noise and can run to 20,000 characters.

The rotation: size-based with a kept count (``<log>.1`` the newest copy, ``<log>.<keep>`` the oldest).
Before a server starts nothing writes the file, so it is renamed. While a server runs it holds the file
open with ``O_APPEND`` (the process supervisor opens it so, and systemd's ``StandardOutput=append:`` too):
the file is copied and truncated in place, and the server's next write lands at the new end of the
now-empty file. What it writes between the copy and the truncation (a few milliseconds) is lost; SGLang
cannot be asked to reopen its log (SIGHUP would stop it), so that is the price of rotating a running server.

Standard library only.
"""

from __future__ import annotations

import os
import re
import shutil

# The defaults of sglang_launch's log_max_bytes and log_keep (the module, the role's defaults and argument
# specs repeat them as literals).
LOG_MAX_BYTES = 100 * 1024 * 1024
LOG_KEEP = 5
# The excerpt's bounds: lines kept before the traceback, lines in all, characters per line and in all.
LINES_BEFORE = 5
LINES_AFTER = 3
MAX_LINES = 40
MAX_LINE_CHARS = 300
MAX_CHARS = 4000
CAUSE_MAX_CHARS = 500
# How much of the end of the file is read at most.
READ_BYTES = 256 * 1024

TRACEBACK = 'Traceback (most recent call last)'
# "RuntimeError: ...", "torch.OutOfMemoryError: ...", "OSError: [Errno 2] ...", "KeyboardInterrupt".
EXCEPTION_RE = re.compile(r'^(?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt|Failure)\b(?::.*)?$')
ERRORISH_RE = re.compile(r'\b(?:error|exception|fatal|failed)\b', re.IGNORECASE)
# SGLang's logging prefix: "[2026-12-02 06:11:08] " or "[2026-12-02 06:11:08 TP0] ".
PREFIX_RE = re.compile(r'^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d[^\]]*\]\s*')


def size(path: str) -> int:
    """The size of ``path`` now (0 when it does not exist): where the next server's lines begin."""
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def read_since(path: str, offset: int = 0) -> str:
    """The text of ``path`` from ``offset`` on (at most its last READ_BYTES); a note when it cannot be read."""
    try:
        with open(path, 'rb') as handle:
            handle.seek(0, os.SEEK_END)
            end = handle.tell()
            # A file shorter than the offset was rotated or truncated meanwhile: all of it is new.
            start = offset if 0 <= offset <= end else 0
            handle.seek(max(start, end - READ_BYTES))
            return handle.read().decode('utf-8', 'replace')
    except OSError as exc:
        return '<cannot read %s: %s>' % (path, exc)


def cut_line(line: str, width: int = MAX_LINE_CHARS) -> str:
    if len(line) <= width:
        return line
    return '%s ... [%d more characters]' % (line[:width], len(line) - width)


def _unprefixed(line: str) -> str:
    return PREFIX_RE.sub('', line).strip()


def find_cause(lines: list[str]) -> tuple[int | None, int | None]:
    """(index of the line where the last traceback begins, index of its exception line); either may be None.

    Without a traceback, the cause is the last line that reads like an exception, else like an error.
    """
    start = None
    for index in range(len(lines) - 1, -1, -1):
        if TRACEBACK in lines[index]:
            start = index
            break
    if start is not None:
        # The exception line is the first one after the header that is not indented (the frames are).
        for index in range(start + 1, len(lines)):
            line = lines[index]
            if line.strip() and not line[:1].isspace():
                return start, index
        return start, None
    for pattern in (EXCEPTION_RE, ERRORISH_RE):
        for index in range(len(lines) - 1, -1, -1):
            text = _unprefixed(lines[index])
            if text and (pattern.match(text) if pattern is EXCEPTION_RE else pattern.search(text)):
                return None, index
    return None, None


def excerpt(text: str, max_lines: int = MAX_LINES, max_chars: int = MAX_CHARS) -> tuple[str | None, str]:
    """(the cause line or None, the lines that matter) of a server's log text.

    With a traceback: LINES_BEFORE lines before it, the traceback, LINES_AFTER lines after its exception
    line. Without: the last lines. Every line cut to MAX_LINE_CHARS; the whole to ``max_lines`` lines and
    ``max_chars`` characters, the end (where the cause is) kept.
    """
    lines = [line for line in text.splitlines() if line.strip()]
    start, cause_index = find_cause(lines)
    if start is not None:
        end = (cause_index if cause_index is not None else len(lines) - 1) + LINES_AFTER + 1
        chosen = lines[max(0, start - LINES_BEFORE) : end]
    elif cause_index is not None:
        chosen = lines[max(0, cause_index - LINES_BEFORE) : cause_index + LINES_AFTER + 1]
    else:
        chosen = lines[-(LINES_BEFORE + LINES_AFTER + 7) :]
    cause = None
    if cause_index is not None:
        cause = cut_line(_unprefixed(lines[cause_index]), CAUSE_MAX_CHARS)
    shown = [cut_line(line) for line in chosen]
    omitted = 0
    if len(shown) > max_lines:
        # Keep the head of the traceback's context and the end, where the exception is.
        omitted = len(shown) - max_lines
        shown = shown[: LINES_BEFORE + 1] + ['... [%d lines left out]' % omitted] + shown[LINES_BEFORE + 1 + omitted + 1 :]
    body = '\n'.join(shown)
    if len(body) > max_chars:
        body = '... [cut]\n' + body[-max_chars:].split('\n', 1)[-1]
    return cause, body


# ---------------------------------------------------------------- rotation


def rotated_name(path: str, number: int) -> str:
    return '%s.%d' % (path, number)


def _shift(path: str, keep: int) -> None:
    """Make room for a new ``<path>.1``: ``.1`` -> ``.2`` ... ``.<keep-1>`` -> ``.<keep>``, the oldest gone."""
    oldest = rotated_name(path, keep)
    if os.path.lexists(oldest):
        os.unlink(oldest)
    for number in range(keep - 1, 0, -1):
        name = rotated_name(path, number)
        if os.path.lexists(name):
            os.replace(name, rotated_name(path, number + 1))


def needs_rotation(path: str, max_bytes: int) -> bool:
    if max_bytes <= 0 or os.path.islink(path):
        return False
    return size(path) >= max_bytes


def rotate(path: str, max_bytes: int, keep: int) -> str | None:
    """Before a server starts (nothing writes ``path``): rename it to ``<path>.1`` when it has reached
    ``max_bytes``, keeping ``keep`` copies (0: none). Returns what became of it, or None when it was small."""
    if not needs_rotation(path, max_bytes):
        return None
    if keep <= 0:
        os.unlink(path)
        return 'removed'
    _shift(path, keep)
    os.replace(path, rotated_name(path, 1))
    return rotated_name(path, 1)


def copy_truncate(path: str, max_bytes: int, keep: int) -> str | None:
    """While a server writes ``path`` (opened with O_APPEND): copy it to ``<path>.1`` and truncate it, when it has
    reached ``max_bytes``, keeping ``keep`` copies (0: none). Returns what became of it, or None."""
    if not needs_rotation(path, max_bytes):
        return None
    if keep > 0:
        _shift(path, keep)
        target = rotated_name(path, 1)
        # The copy is as private as the log (SGLang logs its arguments; some may be secrets).
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with open(path, 'rb') as source, os.fdopen(fd, 'wb') as copy:
            shutil.copyfileobj(source, copy)
    os.truncate(path, 0)
    return rotated_name(path, 1) if keep > 0 else 'truncated'
