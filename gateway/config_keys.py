"""The configuration's keys and text, as its problems are told: key paths (`bindings[0].agent`
is ("bindings", 0, "agent")), ${VAR} interpolation, the TOML type each value of the file must
have, and the SWITCHBOARD__ variables behind a problem. gateway.settings reads the
configuration with these; nothing here knows its sections."""

from __future__ import annotations

import functools
import json
import re
import types
from collections.abc import Mapping
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel, TypeAdapter, ValidationError

from channels.config import REQUIRED_WHEN_ENABLED

__all__ = [
    "ENV_PREFIX",
    "KeyPath",
    "covered",
    "env_path",
    "env_source",
    "interpolate",
    "is_model",
    "key_path",
    "loc_path",
    "mistyped",
    "near",
    "problem",
    "sourced",
    "standing_in",
    "without",
    "without_none",
]

ENV_PREFIX = "SWITCHBOARD__"


def is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def without_none(annotation: Any) -> Any:
    """X for `X | None`."""
    if get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


def mistyped(data: Any, model: Any, key: str) -> list[tuple[str, str]]:
    """The file's values of the wrong TOML type that pydantic's lax mode would take
    (`enabled = 1` enabled a channel, `token_budget = "7000"` was a number): TOML has a type
    for each, so the file must use it. Text from ${VAR} is not checked: like a
    SWITCHBOARD__ override, it is text by nature, read as the key's type ("true", "8080")."""
    out: list[tuple[str, str]] = []
    if is_model(model) and isinstance(data, dict):
        for name, value in data.items():
            field = model.model_fields.get(name)
            if field is not None:  # an unknown key is reported as one
                sub = f"{key}.{name}" if key else name
                out += mistyped(value, without_none(field.annotation), sub)
    elif get_origin(model) is dict and isinstance(data, dict):
        item = without_none(get_args(model)[1])
        if is_model(item):  # [tools.http.NAME], [agents.NAME]: checked key by key
            for name, value in data.items():
                out += mistyped(value, item, f"{key}.{name}")
        else:
            out += _strictly(data, model, key)
    elif get_origin(model) is list and isinstance(data, list):
        item = get_args(model)[0]
        for i, value in enumerate(data):
            out += mistyped(value, item, f"{key}[{i}]")
    elif not (isinstance(data, str) and "${" in data):
        out += _strictly(data, model, key)
    return out


def _strictly(value: Any, annotation: Any, key: str) -> list[tuple[str, str]]:
    """A problem at `key` when `value` is of the right type only to lax validation. Strict is
    JSON's strictness, which TOML's types match: a whole number is a number, a string may be
    one of an enumeration's values."""
    adapter = _adapter(annotation)
    try:
        lax = adapter.validate_python(value)
    except ValidationError:
        return []  # wrong whatever the mode: reported by the validation of the whole
    if isinstance(value, bool) and not isinstance(lax, bool):
        return []  # true for a number: each section refuses it, in its own words
    try:
        text = json.dumps(value)
    except TypeError:  # a TOML date in a tool's parameters, which then failed to be sent
        return [(key, f"a date or a time, which JSON cannot carry, in {_toml(value)}: quote it")]
    try:
        adapter.validate_json(text, strict=True)
    except ValidationError as exc:
        err = exc.errors()[0]
        quoted = " (in quotes, it is text)" if isinstance(value, str) else ""
        wanted = _WANTED.get(err["type"])
        told = f"must be {wanted}" if wanted else str(err["msg"])
        return [(key, f"{told}, not {_toml(value)}{quoted}")]
    return []


_WANTED = {"bool_type": "true or false", "int_type": "a whole number", "float_type": "a number"}


def _toml(value: Any) -> str:
    """How the file spells a value, near enough: "yes", 1, 2.0, true (a date as text)."""
    return json.dumps(value, default=str)


@functools.cache
def _adapter(annotation: Any) -> TypeAdapter[Any]:
    return TypeAdapter(annotation)


# keys and list positions from the top of the configuration: ("bindings", 0, "agent")
KeyPath = tuple[str | int, ...]


def standing_in(data: dict[str, Any], paths: list[KeyPath]) -> dict[str, Any]:
    """`data` with a placeholder string at each of `paths` (a required secret, say)."""
    out = dict(data)
    for path in paths:
        out = _put(out, path, "stand-in")
    return out


def _put(node: Any, path: KeyPath, value: Any) -> Any:
    """A copy of `node` with `value` at `path`, tables made where they are missing."""
    if not path:
        return value
    part, rest = path[0], path[1:]
    if isinstance(part, int):
        items = list(node) if isinstance(node, list) else []
        if part < len(items):
            items[part] = _put(items[part], rest, value)
        return items
    table = dict(node) if isinstance(node, dict) else {}
    table[part] = _put(table.get(part), rest, value)
    return table


def loc_path(loc: tuple[Any, ...]) -> KeyPath:
    """A pydantic location as a path to set aside. A list's item is set aside by its keys, never
    whole: dropping it would renumber the rest (a list item that is wrong as a whole, a name
    in a list of names, has its list set aside)."""
    out = [p if isinstance(p, int) else str(p) for p in loc]
    while out and isinstance(out[-1], int):
        out.pop()
    return tuple(out)


def _loc_key(loc: tuple[Any, ...]) -> str:
    """A pydantic location as the key problems name: `bindings[0].agent`, as the README and
    the ${VAR} problems spell it (not pydantic's `bindings.0.agent`)."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f".{part}" if out else str(part)
    return out


def key_path(key: str) -> KeyPath:
    """`bindings[0].agent` as ("bindings", 0, "agent")."""
    return tuple(int(i) if i else name for i, name in re.findall(r"\[(\d+)\]|([^.\[]+)", key))


def near(path: KeyPath, bad: list[KeyPath]) -> bool:
    """`path` is, holds or lies inside one of `bad`."""
    return any(path[: len(b)] == b or b[: len(path)] == path for b in bad if b)


def env_path(name: str) -> tuple[str, ...]:
    if not name.upper().startswith(ENV_PREFIX):
        return ()
    return tuple(name[len(ENV_PREFIX) :].lower().split("__"))


def without(data: Any, bad: list[KeyPath]) -> Any:
    """`data` without the keys at `bad`, in tables and in the tables of lists."""
    if isinstance(data, list):
        return [without(v, [b[1:] for b in bad if b[:1] == (i,)]) for i, v in enumerate(data)]
    if not isinstance(data, dict) or not bad:
        return data
    out: dict[str, Any] = {}
    for key, value in data.items():
        inside = [b[1:] for b in bad if b and b[0] == key]
        if any(not rest for rest in inside):
            continue
        out[key] = without(value, inside) if inside else value
    return out


def covered(key: str, unset: list[tuple[str, str]]) -> bool:
    """Whether key is (inside) a value whose variable is unset: its empty stand-in is no news."""
    return any(key == bad or key.startswith((f"{bad}.", f"{bad}[")) for bad, _ in unset)


# "$${" (a literal "${"), a reference, or a "${" that starts none (a typo: refused, never kept
# as the text itself, which would make "${SECRET" the secret)
_VAR = re.compile(r"\$\$\{|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}|\$\{")


def interpolate(
    value: Any, env: Mapping[str, str], key: str, problems: list[tuple[str, str]]
) -> Any:
    if isinstance(value, dict):
        return {
            k: interpolate(v, env, f"{key}.{k}" if key else k, problems) for k, v in value.items()
        }
    if isinstance(value, list):
        return [interpolate(v, env, f"{key}[{i}]", problems) for i, v in enumerate(value)]
    if not isinstance(value, str):
        return value

    def repl(m: re.Match[str]) -> str:
        name, default = m.group(1), m.group(2)
        if m.group(0) == "$${":
            return "${"
        if name is None:
            problems.append(
                (key, "a ${ that starts no ${NAME} or ${NAME:-default} (write $${ for the text)")
            )
            return m.group(0)
        if default is not None and "${" in default:
            problems.append((key, f"the default of ${{{name}:-...}} cannot hold another ${{NAME}}"))
            return m.group(0)
        value = env.get(name)
        if default is not None and not value:  # shell semantics: unset or empty
            return default
        if value is not None:
            return value
        problems.append((key, f"environment variable {name} is not set"))
        return ""

    return _VAR.sub(repl, value)


def problem(err: Any, env: Mapping[str, str], data: dict[str, Any]) -> tuple[str, str]:
    key = _loc_key(err["loc"]) or "config"
    if err["type"] == "extra_forbidden":
        return key, "unknown key" + env_source(key, env)
    msg = str(err["msg"]).removeprefix("Value error, ")
    return key, sourced(key, msg, env, data, missing=err["type"] == "missing")


def sourced(
    key: str, msg: str, env: Mapping[str, str], data: dict[str, Any], *, missing: bool = False
) -> str:
    """`msg` naming the variables behind the problem at `key`: those that set it, else those
    that made it required. A tool that SWITCHBOARD__TOOLS__HTTP__NAME__HEADERS alone made
    lacks its description, and a channel a variable enabled lacks its token: both named no
    variable, although the file had no such tool and the channel off."""
    source = env_source(key, env)
    parent = key.rpartition(".")[0]
    if source or not parent:
        return msg + source
    if missing and not _in_file(data, key_path(parent)):
        return msg + env_source(parent, env)
    if msg.startswith(REQUIRED_WHEN_ENABLED):  # (in a mode)
        causes = ("enabled", "mode") if "mode" in msg else ("enabled",)
        return msg + _from({n for k in causes for n in _env_names(f"{parent}.{k}", env)})
    return msg


def _in_file(data: Any, path: KeyPath) -> bool:
    """Whether the file has the table (or list item) at `path`."""
    for part in path:
        listed = isinstance(part, int) and isinstance(data, list) and part < len(data)
        if not (listed or (isinstance(data, dict) and part in data)):
            return False
        data = data[part]
    return True


def env_source(key: str, env: Mapping[str, str]) -> str:
    """ " (from SWITCHBOARD__…)" naming the variables that set `key` (the key itself, a list
    holding it, or a part of it), or "" when only the file did."""
    return _from(_env_names(key, env))


def _env_names(key: str, env: Mapping[str, str]) -> set[str]:
    # "bindings[0].agent" is in the list SWITCHBOARD__BINDINGS sets
    path = re.sub(r"\[\d+\]", "", key)
    var = ENV_PREFIX + path.replace(".", "__").upper()

    def sets_it(name: str) -> bool:
        n = name.upper()
        if not n.startswith(ENV_PREFIX):
            return False
        return n == var or var.startswith(f"{n}__") or n.startswith(f"{var}__")

    return {n for n in env if sets_it(n)}


def _from(names: set[str]) -> str:
    return f" (from {', '.join(sorted(names))})" if names else ""
