# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# This module_utils is PRIVATE to the gpufleet.sglang collection. It may change or be removed
# at any time, in any release. Do not use it from other collections or from your own modules.

"""The errors of the relaunch, worded for an operator: the module fails with their text."""

from __future__ import annotations


class LaunchError(Exception):
    """A failure worded for an operator."""


class SpecError(LaunchError):
    """A parameter is wrong: nothing has been touched."""
