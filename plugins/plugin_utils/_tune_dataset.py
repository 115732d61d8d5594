# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This plugin_utils is PRIVATE to the gpufleet.sglang collection. It may change or be removed
# at any time, in any release. Do not use it from other collections or from your own plugins.

"""The user's own prompts for the sweep's benchmark: a local file on the controller, checked before any host is touched.

SGLang 0.5.23's client reads two local formats (``sglang/benchmark/datasets/``):

- ``sharegpt``: one JSON list of ``{"conversations": [{"value": prompt}, {"value": answer}, ...]}`` (the key
  ``conversation`` is taken too); the client reads the first two turns' ``value`` and fails on an entry without it;
- ``custom``: JSONL, one such object a line, the turns keyed ``content`` or ``value``; lines that are not JSON are
  skipped.

Both keep only conversations of two turns or more and drop prompts under 2 tokens. The sweep fixes every request's
output length (``--sharegpt-output-len``, at least 4 for the client), so only the prompts count here: a prompt counts
when it is text of at least two words (two words are two tokens or more for any tokenizer). The file must hold at
least ``num_prompts`` of them, or the client would run fewer requests than asked and every level would fail.

Nothing of the file's content is ever put in a message: the errors name the field, the path and where (entry,
line); a JSON error says its position only.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat

from ansible_collections.gpufleet.sglang.plugins.plugin_utils._plural import plural

FORMATS = ('sharegpt', 'custom')
# A bigger file is a mistake rather than a benchmark (it is copied to every host).
MAX_BYTES = 512 * 1024 * 1024
FIELD = 'benchmark.dataset'


def _turn_text(turn, keys: tuple[str, ...]):
    if not isinstance(turn, dict):
        return None
    for key in keys:
        if key in turn:
            return turn[key]
    return None


def _usable(text) -> bool:
    return isinstance(text, str) and len(text.split()) >= 2


def _conversation(entry):
    if not isinstance(entry, dict):
        return None
    turns = entry.get('conversations', entry.get('conversation', []))
    return turns if isinstance(turns, list) else None


def count_sharegpt(data, path: str, problems: list[str]) -> int:
    if not isinstance(data, list):
        problems.append('%s: %s is JSON but not a list of ShareGPT conversations ({"conversations": [{"value": ...}, ...]})' % (FIELD, path))
        return 0
    usable = 0
    for index, entry in enumerate(data):
        turns = _conversation(entry)
        if not turns or len(turns) < 2:
            continue
        # The client reads turns[0]["value"] and turns[1]["value"] and stops with a KeyError on an entry without them.
        if not all(isinstance(t, dict) and 'value' in t for t in turns[:2]):
            problems.append(
                '%s: %s entry %d has a turn without "value" among its first two, which SGLang\'s ShareGPT loader cannot read' % (FIELD, path, index)
            )
            return 0
        if _usable(turns[0]['value']):
            usable += 1
    return usable


def count_custom(text: str) -> int:
    usable = 0
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            continue  # the client skips it too
        turns = _conversation(entry)
        if turns and len(turns) >= 2 and _usable(_turn_text(turns[0], ('content', 'value'))):
            usable += 1
    return usable


def check(path_value, dataset_name: str | None, num_prompts: int | None, problems: list[str]) -> dict | None:
    """The dataset's settings for the plan (absolute path, format, sha256, prompts), or None with problems added.

    ``dataset_name`` is what the grid gave (None: from the file: a JSON list is ``sharegpt``, anything else is read
    as ``custom`` JSONL).
    """
    if not isinstance(path_value, str) or not path_value.strip():
        problems.append('%s: %r is not a path to a file of prompts' % (FIELD, path_value))
        return None
    path = os.path.abspath(os.path.expanduser(path_value.strip()))
    try:
        info = os.stat(path)
    except FileNotFoundError:
        problems.append('%s: %s does not exist on the controller' % (FIELD, path))
        return None
    except OSError as exc:
        problems.append('%s: %s cannot be read: %s' % (FIELD, path, exc.strerror))
        return None
    if not stat.S_ISREG(info.st_mode):
        problems.append('%s: %s is not a regular file' % (FIELD, path))
        return None
    if info.st_size == 0:
        problems.append('%s: %s is empty' % (FIELD, path))
        return None
    if info.st_size > MAX_BYTES:
        problems.append('%s: %s is %d MiB, more than the %d MiB a benchmark file may be' % (FIELD, path, info.st_size // 2**20, MAX_BYTES // 2**20))
        return None
    try:
        with open(path, 'rb') as handle:
            blob = handle.read()
    except OSError as exc:
        problems.append('%s: %s cannot be read: %s' % (FIELD, path, exc.strerror))
        return None
    try:
        text = blob.decode('utf-8')
    except UnicodeDecodeError as exc:
        problems.append('%s: %s is not UTF-8 text (byte %d)' % (FIELD, path, exc.start))
        return None
    whole = None
    whole_error: json.JSONDecodeError | None = None
    try:
        whole = json.loads(text)
    except json.JSONDecodeError as exc:
        whole_error = exc
    fmt = dataset_name
    if fmt is None:
        fmt = 'sharegpt' if isinstance(whole, list) else 'custom'
    found = len(problems)
    if fmt == 'sharegpt':
        if whole_error is not None:
            # The position only: the message of a JSON error can quote the text.
            problems.append('%s: %s is not JSON (line %d, column %d)' % (FIELD, path, whole_error.lineno, whole_error.colno))
            return None
        usable = count_sharegpt(whole, path, problems)
    else:
        if isinstance(whole, list):
            problems.append('%s: %s is one JSON list (ShareGPT), not JSONL; give benchmark.dataset_name sharegpt, or none' % (FIELD, path))
            return None
        usable = count_custom(text)
    if len(problems) > found:
        return None
    if usable == 0:
        problems.append(
            '%s: %s holds no usable prompt (a conversation of two turns or more whose first turn has two words or more, as %s expects)'
            % (FIELD, path, 'ShareGPT JSON' if fmt == 'sharegpt' else 'JSONL with "conversations"')
        )
        return None
    if num_prompts is not None and usable < num_prompts:
        problems.append(
            '%s: %s holds %s, fewer than benchmark.num_prompts %d; the client would run fewer requests than asked'
            % (FIELD, path, plural(usable, 'usable prompt'), num_prompts)
        )
        return None
    return dict(dataset=path, dataset_name=fmt, dataset_sha256=hashlib.sha256(blob).hexdigest(), dataset_prompts=usable, dataset_bytes=info.st_size)
