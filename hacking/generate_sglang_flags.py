# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Read the command-line surface of an SGLang wheel without importing SGLang.

Importing ``sglang.srt.server_args`` pulls in torch, so this script parses the
wheel's sources with ``ast`` and replays, statically, what SGLang does when it
builds the ``sglang serve`` parser:

* ``prepare_server_args`` (``sglang/srt/server_args.py``) makes a plain
  ``argparse.ArgumentParser`` (so ``allow_abbrev`` is whatever that call says,
  argparse's default being on) and calls ``ServerArgs.add_cli_args``;
* ``add_cli_args`` first registers every annotated field of the namespace
  classes listed in ``_INPUT_NAMESPACES`` (``sglang/srt/arg_groups/fields/*.py``)
  through ``add_cli_args_from_dataclass`` (``arg_groups/arg_utils.py``), then
  registers a few flags by hand (dynamic choices, deprecated spellings).

Anything the replay does not understand stops it with an error that names the
file and line: a new construct in a new release must be looked at, not guessed.

The table goes into ``plugins/module_utils/_sglang_flags_data.py``, data only; the
code that uses it is ``plugins/module_utils/_sglang_flags.py``, written by hand.
tests/contract/test_sglang_contract.py checks that the committed data file is
exactly what this script writes for the pinned wheel. ``--write`` also writes the
simulated server's own copy, ``tests/simsglang/sglang/simulator/_flags_data.py``
(whole entries: the simulator shares no code with the collection), which
tests/contract/test_speculative_resolution.py holds to the wheel the same way.

Usage, from the repository root::

    python hacking/generate_sglang_flags.py --version 0.5.23            # print the table
    python hacking/generate_sglang_flags.py --version 0.5.23 --write    # regenerate both data files
    python hacking/generate_sglang_flags.py --wheel path/to/sglang.whl  # use a wheel you have
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import pprint
import re
import subprocess
import sys
import zipfile

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_CACHE = os.path.join(REPO_ROOT, ".cache", "sglang-wheels")
GENERATED_MODULE = os.path.join(REPO_ROOT, "plugins", "module_utils", "_sglang_flags_data.py")
# The simulated server's own copy of the table (tests/simsglang): it must not import the collection's code.
SIMULATOR_MODULE = os.path.join(REPO_ROOT, "tests", "simsglang", "sglang", "simulator", "_flags_data.py")

SERVER_ARGS = "sglang/srt/server_args.py"
ARG_UTILS = "sglang/srt/arg_groups/arg_utils.py"
ACTIONS = "sglang/srt/arg_groups/argparse_actions.py"
SPEC_INFO = "sglang/srt/speculative/spec_info.py"
SPEC_REGISTRY = "sglang/srt/speculative/spec_registry.py"
SPEC_FIELDS = "sglang/srt/arg_groups/fields/spec.py"
ENVIRON = "sglang/srt/environ.py"

# argparse's own actions: whether each consumes a value on the command line.
_BUILTIN_ACTIONS_TAKING_NO_VALUE = {"store_true", "store_false", "store_const", "append_const", "count", "help", "version"}
_BUILTIN_ACTIONS_TAKING_VALUE = {"store", "append", "extend"}


class ExtractionError(Exception):
    """The sources hold something this replay does not understand."""


# ---------------------------------------------------------------------------
# Getting the wheel
# ---------------------------------------------------------------------------


def download_wheel(version, cache_dir=DEFAULT_CACHE):
    """Return the path of the sglang==version wheel, downloading it with pip if needed.

    pip reads its index from the machine's configuration; nothing here names one.
    """
    os.makedirs(cache_dir, exist_ok=True)
    found = _cached_wheel(version, cache_dir)
    if found:
        return found
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "sglang==%s" % version, "-d", cache_dir]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
    found = _cached_wheel(version, cache_dir)
    if proc.returncode != 0 or not found:
        raise ExtractionError("could not download sglang==%s with %r (exit %d):\n%s" % (version, " ".join(cmd), proc.returncode, proc.stdout[-4000:]))
    return found


def _cached_wheel(version, cache_dir):
    prefix = "sglang-%s-" % version
    for name in sorted(os.listdir(cache_dir)):
        if name.startswith(prefix) and name.endswith(".whl"):
            return os.path.join(cache_dir, name)
    return None


class Wheel:
    """Sources of one wheel, read straight from the zip file."""

    def __init__(self, path):
        self.path = path
        self._zip = zipfile.ZipFile(path)
        self._names = set(self._zip.namelist())
        self._modules = {}

    def has(self, relpath):
        return relpath in self._names

    def text(self, relpath):
        if relpath not in self._names:
            raise ExtractionError("%s: not in wheel %s" % (relpath, os.path.basename(self.path)))
        return self._zip.read(relpath).decode("utf-8")

    def version(self):
        for name in sorted(self._names):
            if name.endswith(".dist-info/METADATA"):
                for line in self._zip.read(name).decode("utf-8").splitlines():
                    if line.startswith("Version:"):
                        return line.split(":", 1)[1].strip()
        raise ExtractionError("no dist-info METADATA with a Version in %s" % self.path)

    def module(self, relpath):
        if relpath not in self._modules:
            self._modules[relpath] = Module(self, relpath)
        return self._modules[relpath]

    def module_by_name(self, dotted):
        base = dotted.replace(".", "/")
        for candidate in (base + ".py", base + "/__init__.py"):
            if self.has(candidate):
                return self.module(candidate)
        raise ExtractionError("module %s not found in the wheel" % dotted)


# ---------------------------------------------------------------------------
# A small evaluator for the constant expressions the argument definitions use
# ---------------------------------------------------------------------------


class EnumMember:
    """Stand-in for a member of an Enum class defined in the sources."""

    def __init__(self, name, value):
        self.name = name
        self.value = value


class Opaque:
    """A name that is only recorded (a type parser, an action class), never evaluated."""

    def __init__(self, qualname):
        self.qualname = qualname

    def __repr__(self):
        return "Opaque(%s)" % self.qualname


class Module:
    """Module-level names of one source file: assignments, classes, functions, imports."""

    def __init__(self, wheel, relpath):
        self.wheel = wheel
        self.relpath = relpath
        self.tree = ast.parse(wheel.text(relpath), relpath)
        self.assigns = {}
        self.classes = {}
        self.functions = {}
        self.imports = {}  # local name -> (module, name or None for "import x")
        for node in self.tree.body:
            self._index(node)

    def _index(self, node):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    self.assigns[target.id] = node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            self.assigns[node.target.id] = node.value
        elif isinstance(node, ast.ClassDef):
            self.classes[node.name] = node
        elif isinstance(node, ast.FunctionDef):
            self.functions[node.name] = node
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                self.imports[alias.asname or alias.name] = (node.module, alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                self.imports[alias.asname or alias.name.split(".")[0]] = (alias.name, None)

    def where(self, node):
        return "%s:%s" % (self.relpath, getattr(node, "lineno", "?"))

    def lookup(self, name, node):
        """Return ('value', v) or ('class', Module, ClassDef) or ('function', Module, FunctionDef)."""
        if name in self.classes:
            return ("class", self, self.classes[name])
        if name in self.functions:
            return ("function", self, self.functions[name])
        if name in self.assigns:
            return ("value", self.eval(self.assigns[name]))
        if name in self.imports:
            module, attr = self.imports[name]
            if module.split(".")[0] != "sglang":
                return ("value", Opaque(module + "." + (attr or "")))
            if attr is None:
                return ("value", Opaque(module))
            try:
                target = self.wheel.module_by_name(module)
            except ExtractionError:
                # "from package import submodule"
                return ("value", Opaque(module + "." + attr))
            return target.lookup(attr, node)
        if name in ("set", "list", "tuple", "frozenset", "sorted", "str", "int", "float", "bool", "dict"):
            return ("value", Opaque("builtins." + name))
        raise ExtractionError("%s: cannot resolve name %r" % (self.where(node), name))

    def eval(self, node, scope=None):
        """Evaluate a constant expression; raise ExtractionError on anything else."""
        scope = scope or {}
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            values = [self.eval(elt, scope) for elt in node.elts]
            if isinstance(node, ast.Tuple):
                return tuple(values)
            if isinstance(node, ast.Set):
                return set(values)
            return values
        if isinstance(node, ast.Dict):
            return dict((self.eval(k, scope), self.eval(v, scope)) for k, v in zip(node.keys, node.values))
        if isinstance(node, ast.Name):
            if node.id in scope:
                return scope[node.id]
            found = self.lookup(node.id, node)
            if found[0] == "value":
                return found[1]
            if found[0] == "class":
                return ClassRef(found[1], found[2])
            return Opaque(found[1].relpath + ":" + found[2].name)
        if isinstance(node, ast.Attribute):
            base = self.eval(node.value, scope)
            if isinstance(base, ClassRef):
                return base.attr(node.attr, node)
            if isinstance(base, EnumMember) and node.attr in ("name", "value"):
                return getattr(base, node.attr)
            if isinstance(base, Opaque):
                return Opaque(base.qualname + "." + node.attr)
            if isinstance(base, str) and node.attr in ("lower", "upper"):
                return Opaque("str." + node.attr)
            raise ExtractionError("%s: cannot evaluate attribute %s" % (self.where(node), ast.unparse(node)))
        if isinstance(node, ast.BinOp):
            left, right = self.eval(node.left, scope), self.eval(node.right, scope)
            if isinstance(node.op, ast.Add):
                return left + right
            if isinstance(node.op, ast.Mult):
                return left * right
            raise ExtractionError("%s: unsupported operator in %s" % (self.where(node), ast.unparse(node)))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -self.eval(node.operand, scope)
        if isinstance(node, ast.Call):
            return self._call(node, scope)
        if isinstance(node, ast.ListComp) and len(node.generators) == 1:
            gen = node.generators[0]
            if gen.ifs or not isinstance(gen.target, ast.Name):
                raise ExtractionError("%s: unsupported comprehension" % self.where(node))
            out = []
            for item in self.eval(gen.iter, scope):
                inner = dict(scope)
                inner[gen.target.id] = item
                out.append(self.eval(node.elt, inner))
            return out
        raise ExtractionError("%s: cannot evaluate %s" % (self.where(node), ast.unparse(node)))

    def _call(self, node, scope):
        if isinstance(node.func, ast.Attribute) and not node.args and not node.keywords:
            base = self.eval(node.func.value, scope)
            if isinstance(base, str) and node.func.attr in ("lower", "upper"):
                return getattr(base, node.func.attr)()
        func = self.eval(node.func, scope)
        args = [self.eval(a, scope) for a in node.args]
        if node.keywords:
            raise ExtractionError("%s: cannot evaluate call %s" % (self.where(node), ast.unparse(node)))
        if isinstance(func, Opaque) and func.qualname.startswith("builtins.") and len(args) == 1:
            name = func.qualname.split(".", 1)[1]
            seq = args[0]
            if isinstance(seq, ClassRef):
                seq = seq.members()
            return {"set": set, "list": list, "tuple": tuple, "frozenset": frozenset, "sorted": sorted}[name](seq)
        if isinstance(func, Opaque) and ":" in func.qualname and not args:
            # A zero-argument helper defined in the sources: run it.
            relpath, fname = func.qualname.split(":")
            return run_helper(self.wheel.module(relpath), fname)
        raise ExtractionError("%s: cannot evaluate call %s" % (self.where(node), ast.unparse(node)))


class ClassRef:
    """A class from the sources: class-body constants, Enum members."""

    def __init__(self, module, node):
        self.module = module
        self.node = node

    def _body_assigns(self):
        out = {}
        for stmt in self.node.body:
            if isinstance(stmt, ast.Assign):
                for target in stmt.targets:
                    if isinstance(target, ast.Name):
                        out[target.id] = stmt.value
        return out

    def attr(self, name, where):
        body = self._body_assigns()
        if name not in body:
            raise ExtractionError("%s: class %s has no constant %s" % (self.module.where(where), self.node.name, name))
        scope = {}
        for key, value in body.items():  # earlier class constants are visible to later ones
            scope[key] = self.module.eval(value, scope)
            if key == name:
                return scope[key]
        raise AssertionError("unreachable")

    def is_enum(self):
        return any(isinstance(b, ast.Name) and b.id.endswith("Enum") for b in self.node.bases)

    def members(self):
        if not self.is_enum():
            raise ExtractionError("%s: %s is not an Enum" % (self.module.where(self.node), self.node.name))
        out = []
        for key, value in self._body_assigns().items():
            if not key.startswith("_"):
                is_auto = isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "auto"
                out.append(EnumMember(key, None if is_auto else self.module.eval(value)))
        return out


def run_helper(module, fname):
    """Run a zero-argument helper such as ``_reasoning_parser_choices``.

    These helpers first look for a plugin's registry in ``sys.modules``; with no
    plugin loaded that branch is skipped, which is what a stock launch does.
    """
    func = module.functions[fname]
    scope = {}
    for stmt in func.body:
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
            continue
        if isinstance(stmt, ast.Assign) and "sys.modules.get" in ast.unparse(stmt.value):
            continue
        if isinstance(stmt, ast.If) and re.match(r"^\w+ is not None$", ast.unparse(stmt.test)):
            continue
        if isinstance(stmt, ast.ImportFrom):
            target = module.wheel.module_by_name(stmt.module)
            for alias in stmt.names:
                found = target.lookup(alias.name, stmt)
                scope[alias.asname or alias.name] = ClassRef(found[1], found[2]) if found[0] == "class" else found[1]
            continue
        if isinstance(stmt, ast.Return):
            return module.eval(stmt.value, scope)
        raise ExtractionError("%s: unsupported statement in helper %s: %s" % (module.where(stmt), fname, ast.unparse(stmt)[:80]))
    raise ExtractionError("%s: helper %s returns nothing" % (module.where(func), fname))


# ---------------------------------------------------------------------------
# Replaying add_cli_args_from_dataclass over the annotated fields
# ---------------------------------------------------------------------------


def _check_arg_utils(wheel):
    """Fail when the registration helper changes shape: the replay below encodes its rules."""
    mod = wheel.module(ARG_UTILS)
    func = mod.functions.get("add_cli_args_from_dataclass")
    if func is None:
        raise ExtractionError("%s: add_cli_args_from_dataclass is gone" % ARG_UTILS)
    src = ast.unparse(func)
    for needle in (
        "'store_true'",
        "arg_meta.no_cli",
        "arg_meta.aliases",
        "arg_meta.cli_name",
        "_unwrap_literal",
        "origin is list and arg_meta.type_parser is None",
        "inner_type is bool",
        "arg_meta.nargs or '+'",
    ):
        if needle not in src:
            raise ExtractionError(
                "%s: add_cli_args_from_dataclass no longer contains %s; review the replay in hacking/generate_sglang_flags.py" % (ARG_UTILS, needle)
            )
    arg_cls = mod.classes.get("Arg")
    fields = [s.target.id for s in arg_cls.body if isinstance(s, ast.AnnAssign)]
    known = {
        "help",
        "choices",
        "aliases",
        "cli_name",
        "type_parser",
        "nargs",
        "required",
        "action",
        "action_kwargs",
        "const",
        "no_cli",
        "resolvable",
        "fallback",
    }
    if set(fields) - known:
        raise ExtractionError("%s: Arg has new fields %s" % (ARG_UTILS, sorted(set(fields) - known)))


class TypeInfo:
    """What add_cli_args_from_dataclass learns from an annotation."""

    def __init__(self, kind, args=()):
        self.kind = kind  # 'bool', 'int', 'float', 'str', 'list', 'literal', 'union', 'other'
        self.args = args


def _parse_type(module, node):
    """Mirror typing's flattening plus _unwrap_optional for the annotations in use."""
    if isinstance(node, ast.Constant) and node.value is None:
        return TypeInfo("none")
    if isinstance(node, ast.Name):
        return TypeInfo(node.id if node.id in ("bool", "int", "float", "str") else "other", (node.id,))
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _union(module, [node.left, node.right])
    if isinstance(node, ast.Subscript):
        head = ast.unparse(node.value)
        items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        if head in ("Optional", "typing.Optional"):
            return _union(module, [items[0], ast.Constant(None)])
        if head in ("Union", "typing.Union"):
            return _union(module, items)
        if head in ("Literal", "typing.Literal"):
            return TypeInfo("literal", tuple(module.eval(i) for i in items))
        if head in ("List", "list", "typing.List"):
            return TypeInfo("list", (_parse_type(module, items[0]),))
        return TypeInfo("other", (head,))
    if isinstance(node, ast.Attribute):
        return TypeInfo("other", (ast.unparse(node),))
    raise ExtractionError("%s: unsupported annotation %s" % (module.where(node), ast.unparse(node)))


def _union(module, items):
    members = []
    for item in items:
        info = _parse_type(module, item)
        members.extend(info.args if info.kind == "union" else [info])
    return TypeInfo("union", tuple(members))


def _unwrap_optional(info):
    if info.kind == "union":
        non_none = [m for m in info.args if m.kind != "none"]
        if len(non_none) == 1:
            return non_none[0]
    return info


def _type_name(info):
    # _infer_type_func: str, int and float map to themselves, anything else to str.
    return info.kind if info.kind in ("str", "int", "float") else "str"


def _literal_type_name(values):
    first = values[0] if values else ""
    if isinstance(first, bool):
        return "str"  # type(True) is bool, which _infer_type_func maps to str
    if isinstance(first, int):
        return "int"
    if isinstance(first, float):
        return "float"
    return "str"


def _field_meta(module, call_or_str):
    """Arg(...) keyword values; a bare string is Arg(help=...)."""
    if isinstance(call_or_str, ast.Constant) and isinstance(call_or_str.value, str):
        return {}
    if isinstance(call_or_str, ast.JoinedStr):
        return {}
    if not (isinstance(call_or_str, ast.Call) and ast.unparse(call_or_str.func) == "Arg"):
        return None
    if call_or_str.args:
        raise ExtractionError("%s: positional arguments to Arg()" % module.where(call_or_str))
    meta = {}
    for kw in call_or_str.keywords:
        if kw.arg in ("help", "fallback", "resolvable"):
            continue
        if kw.arg in ("type_parser", "action") and not isinstance(kw.value, ast.Constant):
            meta[kw.arg] = Opaque(ast.unparse(kw.value))
        elif kw.arg == "action_kwargs":
            meta[kw.arg] = dict((k.value, ast.unparse(v) if k.value == "type" else module.eval(v)) for k, v in zip(kw.value.keys, kw.value.values))
        else:
            meta[kw.arg] = module.eval(kw.value)
    return meta


def _collect_fields(wheel):
    """Yield (module, field name, annotation node, has default) in ServerArgs' namespace order."""
    server = wheel.module(SERVER_ARGS)
    if "_INPUT_NAMESPACES" not in server.assigns:
        raise ExtractionError("%s: _INPUT_NAMESPACES is gone" % SERVER_ARGS)
    seen = {}
    for name_node in server.assigns["_INPUT_NAMESPACES"].elts:
        kind, module, cls = server.lookup(name_node.id, name_node)
        if kind != "class":
            raise ExtractionError("%s: %s is not a class" % (server.where(name_node), name_node.id))
        for stmt in cls.body:
            if not isinstance(stmt, ast.AnnAssign) or not isinstance(stmt.target, ast.Name):
                continue
            name = stmt.target.id
            if name in seen:
                raise ExtractionError("%s: field %s declared twice" % (module.where(stmt), name))
            seen[name] = True
            yield module, name, stmt


def _action_info(wheel, action):
    """(takes_value, nargs default, default const) for an action given by name or class."""
    if isinstance(action, str):
        if action in _BUILTIN_ACTIONS_TAKING_NO_VALUE:
            return action, False
        if action in _BUILTIN_ACTIONS_TAKING_VALUE:
            return action, True
        raise ExtractionError("unknown argparse action %r" % action)
    name = action.qualname.split(".")[-1]
    if name == "BooleanOptionalAction":
        return name, False
    actions = wheel.module(ACTIONS)
    if name not in actions.classes:
        raise ExtractionError("action class %s is not in %s" % (name, ACTIONS))
    cls = actions.classes[name]
    init = next((s for s in cls.body if isinstance(s, ast.FunctionDef) and s.name == "__init__"), None)
    if init is None:
        return name, None  # plain argparse.Action: nargs as given, None means one value
    args = init.args
    defaults = dict(zip([a.arg for a in args.args][-len(args.defaults) :], args.defaults)) if args.defaults else {}
    if "nargs" in defaults:
        return name, ("nargs-default", actions.eval(defaults["nargs"]))
    return name, None


def _spec(action, takes_value, type_name=None, choices=None, nargs=None, required=False, dest=None, const=None):
    if isinstance(choices, (set, frozenset)):
        choices = sorted(choices, key=lambda c: (c is None, str(c)))
    return {
        "action": action,
        "takes_value": takes_value,
        "type": type_name if takes_value else None,
        "choices": tuple(choices) if choices is not None else None,
        "nargs": nargs,
        "required": bool(required),
        "dest": dest,
        "const": const,
    }


def _register(table, names, spec, where):
    canonical = names[0]
    for flag in names:
        if flag in table:
            raise ExtractionError("%s: %s registered twice (argparse would raise a conflict)" % (where, flag))
        entry = dict(spec)
        entry["canonical"] = canonical
        table[flag] = entry


def _replay_field(wheel, table, module, name, stmt):
    ann = stmt.annotation
    if not (isinstance(ann, ast.Subscript) and ast.unparse(ann.value) in ("A", "Annotated")):
        return  # not annotated with CLI metadata: add_cli_args_from_dataclass skips it
    items = ann.slice.elts
    meta = None
    for extra in items[1:]:
        meta = _field_meta(module, extra)
        if meta is not None:
            break
    if meta is None or meta.get("no_cli"):
        return
    where = module.where(stmt)
    cli_name = meta.get("cli_name") or "--" + name.replace("_", "-")
    names = [cli_name] + list(meta.get("aliases") or [])
    has_default = stmt.value is not None
    raw = _parse_type(module, items[0])

    action = meta.get("action")
    if action is not None:
        action_kwargs = meta.get("action_kwargs") or {}
        aname, info = _action_info(wheel, action)
        if aname == "BooleanOptionalAction":
            _register(table, names, _spec(aname, False, dest=name, const=True), where)
            negated = ["--no-" + n[2:] for n in names if n.startswith("--")]
            _register(table, negated, _spec(aname, False, dest=name, const=False), where)
            return
        nargs = action_kwargs.get("nargs")
        if nargs is None and isinstance(info, tuple):
            nargs = info[1]
        takes_value = nargs != 0
        type_name = action_kwargs.get("type", "str")
        _register(table, names, _spec(aname, takes_value, type_name, meta.get("choices"), nargs, dest=name), where)
        return

    inner = _unwrap_optional(raw)
    if inner.kind == "literal":
        choices = meta.get("choices") or list(inner.args)
        type_name = _opaque_name(meta.get("type_parser")) or _literal_type_name(list(inner.args))
        _register(table, names, _spec("store", True, type_name, choices, dest=name), where)
        return
    if inner.kind == "list" and meta.get("type_parser") is None:
        type_name = _type_name(inner.args[0])
        _register(table, names, _spec("store", True, type_name, meta.get("choices") or None, meta.get("nargs") or "+", dest=name), where)
        return
    if inner.kind == "bool":
        _register(table, names, _spec("store_true", False, dest=name, const=True), where)
        return
    type_name = _opaque_name(meta.get("type_parser")) or _type_name(inner)
    required = meta.get("required") is True or (meta.get("required") is None and not has_default)
    _register(table, names, _spec("store", True, type_name, meta.get("choices") or None, meta.get("nargs"), required=required, dest=name), where)


def _opaque_name(value):
    if value is None:
        return None
    return value.qualname if isinstance(value, Opaque) else repr(value)


# ---------------------------------------------------------------------------
# Replaying the hand-written part of ServerArgs.add_cli_args
# ---------------------------------------------------------------------------


def _env_default(wheel, env_name, where):
    environ = wheel.module(ENVIRON)
    for cls in environ.classes.values():
        for stmt in cls.body:
            if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == env_name for t in stmt.targets):
                call = stmt.value
                if isinstance(call, ast.Call) and call.args:
                    return environ.eval(call.args[0])
    raise ExtractionError("%s: environment variable %s not declared in %s" % (where, env_name, ENVIRON))


def _replay_manual(wheel, table, notes):
    server = wheel.module(SERVER_ARGS)
    cls = server.classes["ServerArgs"]
    func = next(s for s in cls.body if isinstance(s, ast.FunctionDef) and s.name == "add_cli_args")
    scope = {}
    replayed_dataclass = False

    def run(stmts):
        nonlocal replayed_dataclass
        for stmt in stmts:
            where = server.where(stmt)
            if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
                continue
            if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
                call = stmt.value
                fname = ast.unparse(call.func)
                if fname == "add_cli_args_from_dataclass":
                    if [ast.unparse(a) for a in call.args] != ["parser", "ServerArgs"] or call.keywords:
                        raise ExtractionError("%s: unexpected add_cli_args_from_dataclass call" % where)
                    for module, name, field_stmt in _collect_fields(wheel):
                        _replay_field(wheel, table, module, name, field_stmt)
                    replayed_dataclass = True
                    continue
                if fname == "parser.add_argument":
                    _replay_add_argument(wheel, server, table, call, scope)
                    continue
                if isinstance(call.func, ast.Attribute) and call.func.attr == "add" and len(call.args) == 1:
                    target = scope.get(ast.unparse(call.func.value))
                    if isinstance(target, set):
                        target.add(server.eval(call.args[0], scope))
                        continue
                raise ExtractionError("%s: unsupported call %s" % (where, ast.unparse(call)[:100]))
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
                scope[stmt.targets[0].id] = server.eval(stmt.value, scope)
                continue
            if isinstance(stmt, ast.If):
                test = ast.unparse(stmt.test)
                match = re.match(r"^envs\.(\w+)\.get\(\)$", test)
                if not match:
                    raise ExtractionError("%s: unsupported condition %s" % (where, test))
                value = _env_default(wheel, match.group(1), where)
                notes.append("%s is %r by default; the table assumes that default" % (match.group(1), value))
                run(stmt.body if value else stmt.orelse)
                continue
            raise ExtractionError("%s: unsupported statement %s" % (where, ast.unparse(stmt)[:100]))

    run(func.body)
    if not replayed_dataclass:
        raise ExtractionError("%s: add_cli_args no longer calls add_cli_args_from_dataclass" % SERVER_ARGS)


def _replay_add_argument(wheel, server, table, call, scope):
    where = server.where(call)
    names = [server.eval(a, scope) for a in call.args]
    kwargs = {}
    for kw in call.keywords:
        if kw.arg in ("help", "default", "new_flag", "metavar"):
            continue
        if kw.arg in ("action", "type") and not isinstance(kw.value, ast.Constant):
            kwargs[kw.arg] = Opaque(ast.unparse(kw.value))
        else:
            kwargs[kw.arg] = server.eval(kw.value, scope)
    dest = kwargs.get("dest") or names[0].lstrip("-").replace("-", "_")
    action = kwargs.get("action", "store")
    aname, info = _action_info(wheel, action)
    if aname == "BooleanOptionalAction":
        _register(table, names, _spec(aname, False, dest=dest, const=True), where)
        _register(table, ["--no-" + n[2:] for n in names if n.startswith("--")], _spec(aname, False, dest=dest, const=False), where)
        return
    if "nargs" in kwargs:
        nargs = kwargs["nargs"]
    elif isinstance(info, tuple):
        nargs = info[1]
    else:
        nargs = None
    takes_value = info if isinstance(info, bool) else nargs != 0
    if aname in ("store_true", "store_false", "store_const"):
        const = {"store_true": True, "store_false": False}.get(aname, kwargs.get("const"))
    else:
        const = kwargs.get("const_value", kwargs.get("const")) if not takes_value else None
    type_value = kwargs.get("type")
    type_name = _opaque_name(type_value) if isinstance(type_value, Opaque) else (type_value or "str")
    if isinstance(type_name, str) and type_name.startswith("builtins."):
        type_name = type_name.split(".", 1)[1]
    _register(
        table,
        names,
        _spec(aname, takes_value, type_name, kwargs.get("choices"), nargs if takes_value else None, kwargs.get("required", False), dest, const),
        where,
    )


# ---------------------------------------------------------------------------
# The parser itself and the speculative algorithm names
# ---------------------------------------------------------------------------


def _parser_settings(wheel):
    """Find the ArgumentParser(...) call in prepare_server_args and read allow_abbrev / add_help."""
    server = wheel.module(SERVER_ARGS)
    func = server.functions.get("prepare_server_args")
    if func is None:
        raise ExtractionError("%s: prepare_server_args is gone" % SERVER_ARGS)
    calls = [n for n in ast.walk(func) if isinstance(n, ast.Call) and ast.unparse(n.func).endswith("ArgumentParser")]
    if len(calls) != 1:
        raise ExtractionError("%s: expected one ArgumentParser() in prepare_server_args, found %d" % (SERVER_ARGS, len(calls)))
    settings = {"allow_abbrev": True, "add_help": True, "prefix_chars": "-"}
    for kw in calls[0].keywords:
        if kw.arg in settings:
            settings[kw.arg] = server.eval(kw.value)
    return settings


def _speculative_algorithms(wheel):
    info = wheel.module(SPEC_INFO)
    enum = ClassRef(info, info.classes["SpeculativeAlgorithm"])
    members = [m.name for m in enum.members()]
    registry = wheel.module(SPEC_REGISTRY)
    aliases = sorted(registry.eval(registry.assigns["_RESERVED_ALIASES"]))
    # The --speculative-algorithm help text lists the public builtins ("Builtins: A, B, ...").
    spec = wheel.module(SPEC_FIELDS)
    help_text = None
    for stmt in spec.classes["Spec"].body:
        if isinstance(stmt, ast.AnnAssign) and getattr(stmt.target, "id", "") == "speculative_algorithm":
            for item in stmt.annotation.slice.elts[1:]:
                if isinstance(item, ast.Constant) and isinstance(item.value, str):
                    help_text = item.value
    match = re.search(r"Builtins:\s*([A-Z0-9_, ]+)\.", help_text or "")
    documented = [s.strip() for s in match.group(1).split(",")] if match else []
    return {"enum_members": members, "reserved_aliases": aliases, "documented": documented}


def extract(wheel_path):
    """Return the deterministic table for one wheel."""
    wheel = Wheel(wheel_path)
    _check_arg_utils(wheel)
    table = {}
    notes = []
    settings = _parser_settings(wheel)
    if settings["add_help"]:
        _register(table, ["-h", "--help"], _spec("help", False), "argparse add_help")
    _replay_manual(wheel, table, notes)
    return {
        "version": wheel.version(),
        "parser": settings,
        "flags": dict(sorted(table.items())),
        "speculative_algorithms": _speculative_algorithms(wheel),
        "notes": notes,
    }


# ---------------------------------------------------------------------------
# Writing the data module
# ---------------------------------------------------------------------------

# Keys of a table entry, in the order they are written. An entry keeps only the keys whose value differs from
# what FLAG_DEFAULTS gives its action ("store" when the entry names none; an action FLAG_DEFAULTS does not list
# takes the "store" defaults), and leaves "canonical" and "dest" out when they follow the rules of _derived().
# The hand-written plugins/module_utils/_sglang_flags.py (_expand) fills everything back in, render_module checks
# that every entry expands back to what the wheel says, and the contract test holds the expanded table to the wheel.
ENTRY_KEYS = ("canonical", "dest", "action", "takes_value", "type", "nargs", "required", "const", "choices")
DEFAULT_ACTION = "store"
_NO_VALUE = {"takes_value": False, "type": None, "nargs": None, "required": False, "const": True, "choices": None}
FLAG_DEFAULTS = {
    "store": {"takes_value": True, "type": "str", "nargs": None, "required": False, "const": None, "choices": None},
    "store_true": _NO_VALUE,
    "BooleanOptionalAction": _NO_VALUE,
}
LINE_WIDTH = 120


def _derived(flag, canonical):
    """The canonical option string and the dest an entry that leaves them out gets."""
    canonical = canonical or flag
    return canonical, canonical.lstrip("-").replace("-", "_")


def _defaults(action):
    return FLAG_DEFAULTS.get(action, FLAG_DEFAULTS[DEFAULT_ACTION])


def _same(value, default):
    return value == default and type(value) is type(default)


def compact_entry(flag, spec):
    """The entry for one flag: only what differs from the defaults of its action and from _derived()."""
    if set(spec) != set(ENTRY_KEYS):
        raise ExtractionError("%s: unexpected keys %s" % (flag, sorted(set(spec) ^ set(ENTRY_KEYS))))
    defaults = _defaults(spec["action"])
    entry = {}
    for key in ENTRY_KEYS:
        if key == "canonical":
            keep = spec[key] != flag
        elif key == "dest":
            keep = spec[key] != _derived(flag, spec["canonical"])[1]
        elif key == "action":
            keep = spec[key] != DEFAULT_ACTION
        else:
            keep = not _same(spec[key], defaults[key])
        if keep:
            entry[key] = spec[key]
    return entry


def expand_entry(flag, entry):
    """What _sglang_flags._expand makes of an entry; render_module checks every entry round-trips."""
    action = entry.get("action", DEFAULT_ACTION)
    spec = dict(_defaults(action))
    spec["action"] = action
    spec.update(entry)
    canonical, dest = _derived(flag, entry.get("canonical"))
    spec.setdefault("canonical", canonical)
    spec.setdefault("dest", dest)
    return spec


def render_module(result):
    """Render plugins/module_utils/_sglang_flags_data.py from the table and the template."""
    entry_lines = []
    for flag, spec in result["flags"].items():
        entry = compact_entry(flag, spec)
        if expand_entry(flag, entry) != spec:
            raise ExtractionError("%s: the compact entry %r does not expand back to %r" % (flag, entry, spec))
        entry_lines.extend(_render_entry(flag, entry))
    algos = result["speculative_algorithms"]
    replacements = {
        "@@VERSION_TEXT@@": result["version"],
        "@@VERSION@@": '"%s"' % result["version"],
        "@@ALLOW_ABBREV@@": repr(bool(result["parser"]["allow_abbrev"])),
        "@@DEFAULT_ACTION@@": repr(DEFAULT_ACTION),
        "@@FLAG_DEFAULTS@@": _render_defaults(),
        "@@FLAG_ENTRIES@@": "\n".join(entry_lines),
        "@@SPEC_ENUM@@": _render_tuple("SPECULATIVE_ALGORITHM_ENUM", algos["enum_members"]),
        "@@SPEC_ALIASES@@": _render_tuple("SPECULATIVE_ALGORITHM_ALIASES", algos["reserved_aliases"]),
        "@@SPEC_DOCUMENTED@@": _render_tuple("SPECULATIVE_ALGORITHM_DOCUMENTED", algos["documented"]),
        "@@NOTES@@": "\n".join("#   - %s" % n for n in result["notes"]) or "#   (none)",
    }
    text = MODULE_TEMPLATE
    for key, value in replacements.items():
        if key not in text:
            raise ExtractionError("template lacks %s" % key)
        text = text.replace(key, value)
    return text


def _pack(items, indent, width=LINE_WIDTH):
    """Greedy line packing of already-rendered items, each followed by a comma."""
    lines, current = [], ""
    for item in items:
        piece = item + ","
        if current and len(indent) + len(current) + 1 + len(piece) > width:
            lines.append(indent + current)
            current = piece
        else:
            current = piece if not current else current + " " + piece
    if current:
        lines.append(indent + current)
    return lines


def _render_entry(flag, entry):
    """One line per flag; an entry that does not fit spreads over the lines that follow."""
    items = ["%r: %r" % item for item in entry.items()]
    line = "    %r: {%s}," % (flag, ", ".join(items))
    if len(line) <= LINE_WIDTH:
        return [line]
    return ["    %r: {" % flag] + _render_items(entry, " " * 8) + ["    },"]


def _render_items(mapping, indent):
    """The items of a dict, packed; a tuple that does not fit on one line gets lines of its own."""
    lines = _pack(["%r: %r" % item for item in mapping.items() if not isinstance(item[1], tuple)], indent)
    for key, value in mapping.items():
        if isinstance(value, tuple):
            whole = "%s%r: %r," % (indent, key, value)
            if len(whole) <= LINE_WIDTH:
                lines.append(whole)
            else:
                lines.append("%s%r: (" % (indent, key))
                lines.extend(_pack([repr(v) for v in value], indent + " " * 4))
                lines.append(indent + "),")
    return lines


def _render_tuple(name, values):
    line = "%s = %r" % (name, tuple(values))
    if len(line) <= LINE_WIDTH:
        return line
    return "\n".join(["%s = (" % name] + _pack([repr(v) for v in values], " " * 4) + [")"])


def _render_defaults():
    lines = ["{"]
    for action, defaults in FLAG_DEFAULTS.items():
        lines.append("    %r: {" % action)
        lines.extend(_render_items(defaults, " " * 8))
        lines.append("    },")
    lines.append("}")
    return "\n".join(lines)


MODULE_TEMPLATE = r'''# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# GENERATED FILE, DO NOT EDIT. Generated by hacking/generate_sglang_flags.py from the SGLang @@VERSION_TEXT@@
# wheel (sglang/srt/server_args.py and sglang/srt/arg_groups/fields/*.py). To change it, edit the generator and run:
#   python hacking/generate_sglang_flags.py --version <release> --write
#
# This module is private to the gpufleet.sglang collection. Its API can change at any time;
# code outside this collection must not import it. Data only: _sglang_flags.py is the code that reads it.
#
# Assumptions made while reading the sources:
@@NOTES@@

"""The command-line flags of the pinned SGLang release, as data (generated)."""

from __future__ import annotations

SGLANG_VERSION = @@VERSION@@

# Whether prepare_server_args' argparse.ArgumentParser accepts unique prefixes of long flags.
ALLOW_ABBREV = @@ALLOW_ABBREV@@

# Option string -> what argparse was told about it, keeping only what differs from the defaults of the entry's
# action: FLAG_DEFAULTS[action], or FLAG_DEFAULTS[DEFAULT_ACTION] for an action it does not list; an entry without
# "action" has DEFAULT_ACTION. An entry without "canonical" is its own canonical option string; one without "dest"
# has the canonical option string, leading dashes stripped and the others turned into underscores.
# _sglang_flags.FLAGS holds the full entries.
DEFAULT_ACTION = @@DEFAULT_ACTION@@
FLAG_DEFAULTS = @@FLAG_DEFAULTS@@
FLAG_ENTRIES = {
@@FLAG_ENTRIES@@
}

# Names SpeculativeAlgorithm.from_string knows (the enum members), the aliases it maps to EAGLE, and the
# builtins that --speculative-algorithm's help text documents. The parser itself has no choices for it.
@@SPEC_ENUM@@
@@SPEC_ALIASES@@
@@SPEC_DOCUMENTED@@
'''


def render_simulator_module(result):
    """Render tests/simsglang/sglang/simulator/_flags_data.py: every entry whole, nothing to expand.

    The simulated server builds its argparse parser from this table and must share no code with the
    collection, so it gets the wheel's facts in a form it reads without any helper. The layout is the one
    ruff format gives (line length 160, one item a line where an entry does not fit), so formatting the
    tree leaves the file as generated.
    """
    entry_lines = []
    for flag, spec in result["flags"].items():
        if set(spec) != set(ENTRY_KEYS):
            raise ExtractionError("%s: unexpected keys %s" % (flag, sorted(set(spec) ^ set(ENTRY_KEYS))))
        entry_lines.extend(_render_whole_entry(flag, [(key, spec[key]) for key in ENTRY_KEYS]))
    text = SIMULATOR_TEMPLATE
    for key, value in (
        ("@@VERSION_TEXT@@", result["version"]),
        ("@@VERSION@@", '"%s"' % result["version"]),
        ("@@ALLOW_ABBREV@@", repr(bool(result["parser"]["allow_abbrev"]))),
        ("@@FLAGS@@", "\n".join(entry_lines)),
    ):
        if key not in text:
            raise ExtractionError("simulator template lacks %s" % key)
        text = text.replace(key, value)
    return text


SIMULATOR_LINE_WIDTH = 160  # ruff.toml's line-length


def _render_whole_entry(flag, items):
    """One flag as ruff format lays it out: on one line if it fits, else one item a line (tuples likewise)."""
    line = "    %r: {%s}," % (flag, ", ".join("%r: %r" % item for item in items))
    if len(line) <= SIMULATOR_LINE_WIDTH:
        return [line]
    lines = ["    %r: {" % flag]
    for key, value in items:
        item = "        %r: %r," % (key, value)
        if len(item) <= SIMULATOR_LINE_WIDTH or not isinstance(value, tuple):
            lines.append(item)
        else:
            lines.append("        %r: (" % key)
            lines.extend("            %r," % element for element in value)
            lines.append("        ),")
    lines.append("    },")
    return lines


SIMULATOR_TEMPLATE = r'''# Copyright (c) gpufleet.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# GENERATED FILE, DO NOT EDIT. Generated by hacking/generate_sglang_flags.py from the SGLang @@VERSION_TEXT@@
# wheel (sglang/srt/server_args.py and sglang/srt/arg_groups/fields/*.py). To change it, edit the generator and run:
#   python hacking/generate_sglang_flags.py --version <release> --write
# tests/contract/test_speculative_resolution.py checks that this file is what the generator writes for the wheel.

"""The command line of SGLang @@VERSION_TEXT@@, as data, for the simulated server's parser (generated)."""

from __future__ import annotations

SGLANG_VERSION = @@VERSION@@

# Whether prepare_server_args' argparse.ArgumentParser accepts unique prefixes of long flags.
ALLOW_ABBREV = @@ALLOW_ABBREV@@

# Option string -> what add_argument was told: "canonical" is the first option string of the argument (its aliases
# share its "dest"), "action" the argparse action (a name of SGLang's own action class where it has one),
# "takes_value" whether it consumes a value, "type" the name of the converter, "nargs", "required", "const" (what a
# flag without a value stores) and "choices" (None or a tuple), as SGLang's parser has them.
FLAGS = {
@@FLAGS@@
}
'''


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--version", help="SGLang release to download with pip (into --cache)")
    source.add_argument("--wheel", help="path of an SGLang wheel")
    parser.add_argument("--cache", default=DEFAULT_CACHE, help="wheel cache directory (default: %(default)s)")
    parser.add_argument(
        "--write",
        action="store_true",
        help="write %s and %s" % (os.path.relpath(GENERATED_MODULE, REPO_ROOT), os.path.relpath(SIMULATOR_MODULE, REPO_ROOT)),
    )
    parser.add_argument("--json", action="store_true", help="print the table as JSON instead of Python")
    args = parser.parse_args(argv)
    try:
        wheel = args.wheel or download_wheel(args.version, args.cache)
        result = extract(wheel)
        text = render_module(result) if args.write else None
        simulator_text = render_simulator_module(result) if args.write else None
    except ExtractionError as exc:
        print("generate_sglang_flags: %s" % exc, file=sys.stderr)
        return 1
    if args.write:
        with open(GENERATED_MODULE, "w", encoding="utf-8") as handle:
            handle.write(text)
        with open(SIMULATOR_MODULE, "w", encoding="utf-8") as handle:
            handle.write(simulator_text)
        for path in (GENERATED_MODULE, SIMULATOR_MODULE):
            print("wrote %s: %d flags from sglang %s" % (path, len(result["flags"]), result["version"]))
    elif args.json:
        print(json.dumps(result, indent=1, sort_keys=True, default=list))
    else:
        pprint.pprint(result, width=160, sort_dicts=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
