"""Skills: folders holding a SKILL.md (what it does, when to use it, how to call it) and optional
Python scripts. The agent sees each skill's one-line summary up front and loads the rest on demand.

SKILL.md starts with front matter of flat `key: value` lines (the format other agent tools use):

    ---
    name: rental-quote
    summary: Price quote for a bike rental from bike type and duration.
    network: false
    ---

`description` is accepted for `summary`; `name` defaults to the folder name; without front matter
the first line of body text is the summary. `network: true` lets the skill's scripts connect out.
A UTF-8 byte order mark is ignored; front matter opened but never closed is an error, not body.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from core.errors import ConfigError

__all__ = [
    "SKILL_FILE",
    "Skill",
    "discover_skills",
    "parse_skill_md",
    "session_workdir",
    "skills_prompt",
]

SKILL_FILE = "SKILL.md"
MAX_SUMMARY = 200
_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
_OPEN = re.compile(r"\A---[ \t]*(?:\n|\Z)")
_FRONT = re.compile(r"\A---[ \t]*\n(.*?)^---[ \t]*(?:\n|\Z)", re.DOTALL | re.MULTILINE)
_KEY = re.compile(r"^([A-Za-z][\w-]*)\s*:\s*(.*?)\s*$")
_SLUG = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True, slots=True)
class Skill:
    name: str
    summary: str  # one line: all the agent sees before it loads the skill
    path: Path  # the skill's folder, resolved
    instructions: str  # the whole SKILL.md
    network: bool = False

    def scripts(self) -> list[str]:
        """The skill's Python scripts (really inside its folder), relative to the folder."""
        found = []
        for p in self.path.rglob("*.py"):
            rel = p.relative_to(self.path)
            hidden = any(part.startswith((".", "__")) for part in rel.parts)
            if not hidden and p.is_file() and p.resolve().is_relative_to(self.path):
                found.append(rel.as_posix())
        return sorted(found)


def parse_skill_md(text: str, folder: str) -> tuple[str, str, bool]:
    """(name, summary, network) of a SKILL.md; ValueError says what is wrong."""
    meta, body = _front_matter(text.removeprefix("\ufeff"))  # the BOM some editors write
    name = meta.get("name") or folder
    if not _NAME.match(name):
        raise ValueError(f"name {name!r} must be lowercase letters, digits, '-' or '_'")
    summary = meta.get("summary") or meta.get("description") or _first_line(body)
    if not summary:
        raise ValueError("no summary: add 'summary: ...' to the front matter")
    if len(summary) > MAX_SUMMARY or "\n" in summary:
        raise ValueError(f"the summary must be one line of at most {MAX_SUMMARY} characters")
    network = meta.get("network", "false").lower()
    if network not in ("true", "false"):
        raise ValueError(f"network must be true or false, not {network!r}")
    return name, summary, network == "true"


def _front_matter(text: str) -> tuple[dict[str, str], str]:
    """The front matter's keys (lowercased) and the body after it. Opened but never closed is an
    error: read as body, its `---` would become the summary and its keys would be lost."""
    m = _FRONT.match(text)
    if m is None:
        if _OPEN.match(text):
            raise ValueError("front matter opened with '---' is never closed by a '---' line")
        return {}, text
    meta: dict[str, str] = {}
    for line in m.group(1).splitlines():
        if kv := _KEY.match(line):
            meta[kv.group(1).lower()] = _unquote(kv.group(2))
        elif line.strip() and not line.lstrip().startswith("#"):
            raise ValueError(f"front matter line is not 'key: value': {line.strip()!r}")
    return meta, text[m.end() :]


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


def _first_line(body: str) -> str:
    for line in body.splitlines():
        line = line.strip()
        if line and not line.startswith(("#", "```", "<!--")):
            return line
    return ""


def discover_skills(root: str | Path) -> list[Skill]:
    """Every `<root>/<folder>/SKILL.md`, sorted by name; a bad one is a ConfigError (at start,
    naming its file), so a broken skill never reaches the agent half-described."""
    base = Path(root)
    try:
        if not base.is_dir():
            return []
    except OSError as exc:  # a name too long for the file system, say
        raise ConfigError([(base.as_posix(), f"cannot be read: {exc.strerror}")]) from None
    skills: dict[str, Skill] = {}
    problems: list[tuple[str, str]] = []
    for doc in sorted(base.glob(f"*/{SKILL_FILE}")):
        where = doc.as_posix()
        try:
            text = doc.read_text(encoding="utf-8-sig")  # no BOM in what load_skill shows
            name, summary, network = parse_skill_md(text, doc.parent.name)
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            problems.append((where, str(exc)))
            continue
        if name in skills:
            problems.append((where, f"duplicate skill name {name!r}"))
            continue
        skills[name] = Skill(name, summary, doc.parent.resolve(), text, network)
    if problems:
        raise ConfigError(problems)
    return [skills[n] for n in sorted(skills)]


def skills_prompt(skills: list[Skill]) -> str:
    """The lines added to the agent's instructions: each skill's name and summary."""
    if not skills:
        return ""
    lines = [f"- {s.name}: {s.summary}" for s in skills]
    return (
        "Skills you can use (call load_skill with the name to read how, then run_skill_script):\n"
        + "\n".join(lines)
    )


def session_workdir(root: str | Path, session: str) -> Path:
    """The session's own working folder under root, created on demand. The name is a readable
    slug plus a hash of the key, so no session key can point outside root or at another's."""
    slug = _SLUG.sub("_", session).strip("._")[:48] or "session"
    digest = hashlib.sha256(session.encode()).hexdigest()[:12]
    path = Path(root).resolve() / f"{slug}-{digest}"
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path
