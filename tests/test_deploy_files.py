"""The deployment files and the channel docs agree with the code.

Dockerfile: CMD is a real CLI command, EXPOSE the configured port, the HEALTHCHECK command passes
against the gateway's /healthz (and fails without it), ENV names real settings, the data paths sit
in the volume, COPY sources exist and survive .dockerignore. systemd unit: parses, runs a real
command, stops after the shutdown grace, can write where the configuration writes. Docs: every
key table matches the settings classes (names and defaults), every TOML snippet loads, every
dotted key and `key = value` exists, every route exists, every `switchboard ...` command parses.
"""

from __future__ import annotations

import asyncio
import configparser
import fnmatch
import functools
import json
import os
import re
import shlex
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
from aiohttp import web
from pydantic import BaseModel

from gateway.app import build_app
from gateway.cli import EXIT_CONFIG, main
from gateway.settings import DEFAULT_CONFIG, EXAMPLE_CONFIG, Settings, load_settings

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
UNIT = ROOT / "deploy" / "switchboard.service"
DEPLOY_README = ROOT / "deploy" / "README.md"
CHANNEL_DOCS = {p.stem: p for p in sorted((ROOT / "docs" / "channels").glob("*.md"))}
DOCS = [*CHANNEL_DOCS.values(), DEPLOY_README]
# gateway/cli.py serves with web.run_app(shutdown_timeout=5.0): open requests get that long
# before the runtime's own drain (server.shutdown_grace_s) starts
HTTP_DRAIN_S = 5.0
DUMMY = "test-value_1"  # a value every secret validator accepts (webhook_secret's charset too)
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-[^}]*)?\}")
_SPAN = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
_FENCE = re.compile(r"^[ \t]*```(\w*)\n(.*?)^[ \t]*```", re.MULTILINE | re.DOTALL)


# ---------------------------------------------------------------------------------------------
# helpers


def example() -> Settings:
    return load_settings(EXAMPLE_CONFIG, environ={})


def cli_parses(argv: list[str]) -> None:
    """`switchboard ARGV --help` is accepted by the CLI's argparse (exit 0, not 2)."""
    with pytest.raises(SystemExit) as info:
        main([*argv, "--help"])
    assert info.value.code == 0, f"`switchboard {shlex.join(argv)}` is not a valid command"


def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order: comments dropped, continued lines joined."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        instruction, _, args = (pending + line).partition(" ")
        out.append((instruction.upper(), " ".join(args.split())))
        pending = ""
    assert not pending, "the Dockerfile ends inside a continued line"
    return out


def docker(name: str) -> list[str]:
    return [args for instruction, args in dockerfile() if instruction == name]


def healthcheck() -> tuple[str, list[str]]:
    """The HEALTHCHECK's options and its exec-form command."""
    (args,) = docker("HEALTHCHECK")
    options, sep, command = args.partition("CMD ")
    assert sep, "HEALTHCHECK must run a command (CMD)"
    argv = json.loads(command)
    assert isinstance(argv, list), "HEALTHCHECK CMD must be the exec (JSON) form"
    return options, [str(a) for a in argv]


class _Unit(configparser.ConfigParser):
    def optionxform(self, optionstr: str) -> str:
        return optionstr  # systemd keys are case-sensitive


def unit() -> _Unit:
    parser = _Unit(strict=False, interpolation=None)
    parser.read_string(UNIT.read_text(encoding="utf-8"))
    return parser


def seconds(span: str) -> float:
    """A systemd time span ("30", "30s", "1min 30s") in seconds."""
    units = {"": 1, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "hr": 3600, "ms": 0.001}
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", span)
    assert parts, f"not a time span: {span!r}"
    assert "".join(n + u for n, u in parts) == span.replace(" ", ""), f"unparsed: {span!r}"
    return sum(float(n) * units[u] for n, u in parts)


def writable_paths(s: Settings) -> list[PurePosixPath]:
    """Where the gateway writes with this configuration, relative to its working directory."""
    return [
        PurePosixPath(s.sqlite_path()).parent,
        PurePosixPath(s.channels.media_dir),
        PurePosixPath(s.agent.workspace_dir),
        PurePosixPath(s.agent.knowledge_cache).parent,
    ]


def inside(path: PurePosixPath, roots: list[PurePosixPath]) -> bool:
    return any(path == r or path.is_relative_to(r) for r in roots)


def ignored(rel: str, patterns: list[str]) -> bool:
    """Whether .dockerignore keeps `rel` (or a directory above it) out of the build context."""
    parts = rel.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pattern in patterns:
        if pattern.startswith("**/"):
            if any(fnmatch.fnmatchcase(p, pattern[3:]) for p in parts):
                return True
        elif any(fnmatch.fnmatchcase(p, pattern) for p in prefixes):
            return True
    return False


def dockerignore() -> list[str]:
    lines = DOCKERIGNORE.read_text(encoding="utf-8").splitlines()
    patterns = [ln.strip() for ln in lines if ln.strip() and not ln.strip().startswith("#")]
    assert not [p for p in patterns if p.startswith("!")], "exceptions (!) are not checked here"
    return [p.rstrip("/") for p in patterns]


def model_of(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model behind an annotation (`X` or `X | None`), if any."""
    candidates = [annotation, *getattr(annotation, "__args__", ())]
    for c in candidates:
        if isinstance(c, type) and issubclass(c, BaseModel):
            return c
    return None


def channel_model(name: str) -> type[BaseModel]:
    channels = model_of(Settings.model_fields["channels"].annotation)
    assert channels is not None
    model = model_of(channels.model_fields[name].annotation)
    assert model is not None, f"no [channels.{name}] section in Settings"
    return model


def spans(text: str) -> list[str]:
    """Inline code spans, outside fenced blocks."""
    return _SPAN.findall(_FENCE.sub("", text))


def fences(text: str, *languages: str) -> list[str]:
    return [body for lang, body in _FENCE.findall(text) if lang in languages]


def key_tables(text: str) -> Iterator[tuple[str, str]]:
    """(key cell, default cell) of every `| key | default | meaning |` table."""
    rows: list[list[str]] = []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
            continue
        if rows and rows[0] == ["key", "default", "meaning"]:
            for cells in rows[2:]:
                yield cells[0], cells[1]
        rows = []


def commands(text: str) -> Iterator[list[str]]:
    """The arguments after `switchboard` in every shell command of a doc (code spans and
    sh blocks), inside `sh -c '...'` strings too."""
    lines = spans(text)
    for block in fences(text, "sh", "shell", "bash", "console"):
        lines.extend(block.replace("\\\n", " ").splitlines())
    for line in lines:
        if "switchboard" in line:  # other lines may hold half of a multi-line quoted string
            yield from _commands_in(line)


def _commands_in(line: str) -> Iterator[list[str]]:
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|()")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    command: list[str] = []
    for token in [*lexer, ";"]:
        if token and set(token) <= set(";&|()"):
            yield from _switchboard_args(command)
            command = []
        elif " " in token:  # a quoted script, e.g. sh -c '...'
            yield from _commands_in(token)
        else:
            command.append(token)


def _switchboard_args(tokens: list[str]) -> Iterator[list[str]]:
    """After the last `switchboard` program token that is followed by a subcommand (so
    `--name switchboard -p ...`, `useradd ... switchboard` are not commands)."""
    starts = [
        i
        for i, t in enumerate(tokens[:-1])
        if (t == "switchboard" or t.endswith("/bin/switchboard"))
        and not tokens[i + 1].startswith("-")
    ]
    if starts:
        yield tokens[starts[-1] + 1 :]


def load_snippet(tmp_path: Path, toml: str) -> Settings:
    """A TOML snippet through the real loader, its ${VAR}s set to a dummy value."""
    path = tmp_path / "snippet.toml"
    path.write_text(toml, encoding="utf-8")
    env = {name: DUMMY for name in _VAR.findall(toml)}
    return load_settings(path, environ=env)


@functools.cache
def all_routes() -> set[tuple[str, str]]:
    """(method, path) of the app with every channel enabled (Telegram in webhook mode)."""
    env = {"SWITCHBOARD__SERVER__PUBLIC_URL": "https://bot.example.com"}
    secrets = {
        "telegram": ("token", "webhook_secret"),
        "slack": ("bot_token", "signing_secret"),
        "whatsapp": ("access_token", "app_secret", "verify_token", "phone_number_id"),
    }
    for channel, keys in secrets.items():
        prefix = f"SWITCHBOARD__CHANNELS__{channel.upper()}__"
        env[prefix + "ENABLED"] = "true"
        env[prefix + "API_BASE"] = "http://127.0.0.1:9"
        env.update({prefix + k.upper(): DUMMY for k in keys})
    env["SWITCHBOARD__CHANNELS__TELEGRAM__TOKEN"] = "123456:" + DUMMY  # <bot id>:<secret>
    app = build_app(load_settings(EXAMPLE_CONFIG, environ=env))
    return {(r.method, r.resource.canonical) for r in app.router.routes() if r.resource}


# ---------------------------------------------------------------------------------------------
# Dockerfile


def test_dockerfile_is_one_small_stage_running_as_a_user() -> None:
    assert docker("FROM") == ["python:3.11-slim"]
    order = [instruction for instruction, _ in dockerfile()]
    (user,) = docker("USER")
    assert user.split(":")[0] not in ("root", "0"), "the gateway must not run as root"
    assert order.index("USER") < order.index("CMD")
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert "postgres" in pyproject["project"]["optional-dependencies"]
    assert pyproject["project"]["scripts"]["switchboard"] == "gateway.cli:main"
    assert any(
        re.search(r"pip install --no-cache-dir \"?\.\[postgres\]\"?", run) for run in docker("RUN")
    ), 'the package is installed with `pip install --no-cache-dir ".[postgres]"`'


def test_dockerfile_cmd_is_switchboard_run() -> None:
    (cmd,) = docker("CMD")
    argv = json.loads(cmd)
    assert argv[:2] == ["switchboard", "run"], "exec form, the console script, `run`"
    cli_parses(argv[1:])


def test_dockerfile_exposes_the_configured_port_on_every_interface() -> None:
    settings = example()
    assert docker("EXPOSE") == [str(settings.server.port)]
    env: dict[str, str] = {}
    for args in docker("ENV"):
        for pair in shlex.split(args):
            name, sep, value = pair.partition("=")
            assert sep, f"ENV {pair}: use the NAME=value form"
            env[name] = value
    ours = {k: v for k, v in env.items() if k.startswith("SWITCHBOARD__")}
    assert ours.get("SWITCHBOARD__SERVER__HOST") == "0.0.0.0"
    # every SWITCHBOARD__ variable of the image is a real setting and wins over the file
    assert load_settings(EXAMPLE_CONFIG, environ=ours).server.host == "0.0.0.0"


def test_dockerfile_keeps_data_in_the_volume_and_reads_a_mounted_config() -> None:
    workdir = PurePosixPath(docker("WORKDIR")[-1])
    volumes = [PurePosixPath(v) for args in docker("VOLUME") for v in json.loads(args)]
    for path in writable_paths(example()):
        assert inside(workdir / path, volumes), f"{workdir / path} is not in a VOLUME"
    # `switchboard run` falls back to config/switchboard.toml in its working directory
    mounted = str(workdir / DEFAULT_CONFIG)
    assert mounted in DEPLOY_README.read_text(encoding="utf-8"), f"document {mounted}"


def test_dockerfile_copies_what_exists_and_dockerignore_keeps_secrets_out() -> None:
    patterns = dockerignore()
    sources = []
    for args in docker("COPY"):
        assert not args.startswith("--from"), "single stage: COPY from the build context only"
        sources.extend(shlex.split(args)[:-1])
    assert "config" in sources, "the image ships config/ (example config, knowledge, skills)"
    for source in sources:
        path = ROOT / source
        assert path.exists(), f"COPY {source}: no such file in the repository"
        files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
        for f in files:
            rel = f.relative_to(ROOT).as_posix()
            if "__pycache__" in rel or rel == DEFAULT_CONFIG.as_posix():
                continue
            assert not ignored(rel, patterns), f"{rel} is needed but .dockerignore excludes it"
    for private in (DEFAULT_CONFIG.as_posix(), ".venv", "data", ".git", "prod.env", ".env"):
        assert ignored(private, patterns), f".dockerignore must exclude {private}"


async def test_healthcheck_passes_against_the_gateway_and_fails_without_it(
    tmp_path: Path,
) -> None:
    options, argv = healthcheck()
    assert argv[:2] == ["python", "-c"], "python's urllib: the slim image has no curl"
    (path,) = re.findall(r"'(/[a-z]+)'", argv[2])
    assert ("GET", path) in all_routes(), f"HEALTHCHECK calls {path}, which is not a route"
    limit = re.search(r"--timeout=(\d+)s", options)
    own = re.search(r"timeout=(\d+)\)", argv[2])
    assert limit, "HEALTHCHECK --timeout=Ns"
    assert own, "the check's own urllib timeout"
    assert int(own.group(1)) < int(limit.group(1)), "urllib must give up before Docker does"

    env = {
        "SWITCHBOARD__STORE__URL": f"sqlite:///{tmp_path}/sb.db",
        "SWITCHBOARD__CHANNELS__MEDIA_DIR": str(tmp_path / "files"),
        "SWITCHBOARD__AGENT__WORKSPACE_DIR": str(tmp_path / "workspace"),
        "SWITCHBOARD__AGENT__KNOWLEDGE_CACHE": str(tmp_path / "index.json"),
    }
    runner = web.AppRunner(build_app(load_settings(EXAMPLE_CONFIG, environ=env)))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def check() -> int:
        # a proxy meant for the model's traffic must not catch the local check
        proxy = "http://127.0.0.1:9"
        child_env = {
            **os.environ,
            "SWITCHBOARD__SERVER__PORT": str(port),
            "http_proxy": proxy,
            "HTTP_PROXY": proxy,
        }
        child_env.pop("no_proxy", None)
        child_env.pop("NO_PROXY", None)
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            *argv[1:],
            env=child_env,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        return await asyncio.wait_for(proc.wait(), 30)

    try:
        assert await check() == 0, "the HEALTHCHECK command fails against a healthy gateway"
    finally:
        await runner.cleanup()
    assert await check() != 0, "the HEALTHCHECK command passes with no gateway listening"


# ---------------------------------------------------------------------------------------------
# systemd unit


def test_unit_runs_switchboard_run_with_its_config() -> None:
    u = unit()
    assert {"Unit", "Service", "Install"} <= set(u.sections())
    service = u["Service"]
    argv = shlex.split(service["ExecStart"])
    workdir = PurePosixPath(service["WorkingDirectory"])
    assert PurePosixPath(argv[0]) == workdir / ".venv/bin/switchboard"
    assert argv[1] == "run"
    assert "--config" in argv
    assert PurePosixPath(argv[argv.index("--config") + 1]).is_absolute()
    cli_parses(argv[1:])
    assert service["User"] not in ("", "root", "0")
    assert PurePosixPath(service["EnvironmentFile"].lstrip("-")).is_absolute()
    assert service["Restart"] == "on-failure"
    assert str(EXIT_CONFIG) in service["RestartPreventExitStatus"].split()
    assert u["Install"]["WantedBy"] == "multi-user.target"


def test_unit_stops_after_the_shutdown_grace() -> None:
    service = unit()["Service"]
    assert service["KillSignal"] == "SIGTERM"
    grace = example().server.shutdown_grace_s
    timeout = seconds(service["TimeoutStopSec"])
    assert timeout > grace + HTTP_DRAIN_S, (
        f"TimeoutStopSec={timeout:g}s must exceed server.shutdown_grace_s={grace:g}s plus the "
        f"{HTTP_DRAIN_S:g}s aiohttp gives open requests, or systemd kills running turns"
    )
    readme = DEPLOY_README.read_text(encoding="utf-8")
    assert f"TimeoutStopSec={service['TimeoutStopSec']}" in readme


def test_unit_is_hardened_but_can_write_where_the_gateway_writes() -> None:
    service = unit()["Service"]
    assert service["NoNewPrivileges"] == "yes"
    assert service["ProtectSystem"] == "strict"
    assert service["PrivateTmp"] == "yes"
    workdir = PurePosixPath(service["WorkingDirectory"])
    writable = [PurePosixPath(p.lstrip("-")) for p in service["ReadWritePaths"].split()]
    for path in writable_paths(example()):
        assert inside(workdir / path, writable), f"{workdir / path} is not in ReadWritePaths"


# ---------------------------------------------------------------------------------------------
# docs


def test_every_channel_has_a_doc() -> None:
    assert set(CHANNEL_DOCS) == {"telegram", "slack", "whatsapp"}


@pytest.mark.parametrize("channel", ["telegram", "slack", "whatsapp"])
def test_key_tables_match_the_settings_class(channel: str) -> None:
    model = channel_model(channel)
    documented: set[str] = set()
    for key_cell, default_cell in key_tables(CHANNEL_DOCS[channel].read_text(encoding="utf-8")):
        m = re.fullmatch(r"`([a-z_]+)`", key_cell)
        assert m, f"{channel}: key cell {key_cell!r} is not one `key`"
        key = m.group(1)
        assert key in model.model_fields, f"channels.{channel}.{key} does not exist"
        documented.add(key)
        actual = model.model_fields[key].get_default(call_default_factory=True)
        literal = re.fullmatch(r"`([^`]+)`", default_cell)
        if literal:
            value = tomllib.loads(f"v = {literal.group(1)}")["v"]
            assert value == actual, f"channels.{channel}.{key}: default is {actual!r}"
        elif default_cell.startswith("unset"):
            assert actual is None, f"channels.{channel}.{key}: default is {actual!r}, not unset"
        else:  # prose is for long texts only
            assert isinstance(actual, str), f"channels.{channel}.{key}: write the default"
            assert len(actual) > 60, f"channels.{channel}.{key}: write the default"
    missing = set(model.model_fields) - documented
    assert not missing, f"{channel}.md does not document: {sorted(missing)}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_toml_snippets_load(doc: Path, tmp_path: Path) -> None:
    blocks = fences(doc.read_text(encoding="utf-8"), "toml")
    assert blocks or doc == DEPLOY_README
    for toml in blocks:
        load_snippet(tmp_path, toml)  # a ConfigError names the key


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_keys_in_code_spans_exist(doc: Path, tmp_path: Path) -> None:
    channel = doc.stem if doc.stem in CHANNEL_DOCS else None
    sections = set(Settings.model_fields)
    for span in spans(doc.read_text(encoding="utf-8")):
        if m := re.fullmatch(r"([a-z_]+(?:\.[a-z_]+)*) = (.+)", span):
            key, value = m.groups()
            if key.split(".")[0] in sections:
                load_snippet(tmp_path, f"{key} = {value}\n")
            elif channel and "." not in key:
                load_snippet(tmp_path, f"[channels.{channel}]\n{key} = {value}\n")
        elif re.fullmatch(r"[a-z_]+(?:\.[a-z_]+)+", span) and span.split(".")[0] in sections:
            model: type[BaseModel] | None = Settings
            for part in span.split("."):
                assert model is not None, f"no key `{span}`"
                assert part in model.model_fields, f"no key `{span}`"
                model = model_of(model.model_fields[part].annotation)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_routes_in_docs_exist(doc: Path) -> None:
    text = doc.read_text(encoding="utf-8")
    paths = set(re.findall(r"/webhooks/[a-z]+", text))
    paths |= set(re.findall(r"(?<![\w.])/(?:healthz|readyz|metrics)\b", text))
    served = {path for _, path in all_routes()}
    assert not paths - served, f"{doc.name} names routes the gateway does not serve"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_switchboard_commands_in_docs_parse(doc: Path) -> None:
    found = list(commands(doc.read_text(encoding="utf-8")))
    assert found, f"{doc.name} shows no switchboard command"
    for argv in found:
        cli_parses(argv)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_repository_paths_and_json_in_docs_exist(doc: Path) -> None:
    text = doc.read_text(encoding="utf-8")
    for block in fences(text, "json"):
        json.loads(block)
    for span in spans(text):
        m = re.fullmatch(r"((?:tests|channels|gateway|core|config|deploy|docs)/[\w./*-]+)", span)
        if m and m.group(1) != DEFAULT_CONFIG.as_posix():
            assert list(ROOT.glob(m.group(1).rstrip("/"))), f"{doc.name}: no {m.group(1)}"


def test_slack_manifest_matches_the_scope_and_event_tables() -> None:
    text = CHANNEL_DOCS["slack"].read_text(encoding="utf-8")
    (manifest,) = [json.loads(b) for b in fences(text, "json") if "oauth_config" in b]
    tables: dict[str, set[str]] = {"bot scope": set(), "bot event": set()}
    header = ""
    for line in text.splitlines():
        if not line.startswith("|"):
            header = ""
            continue
        first = line.strip("|").split("|")[0].strip()
        if not header:
            header = first
        elif header in tables and not first.startswith("---"):
            tables[header].update(re.findall(r"`([a-z_.:]+)`", first))
    assert set(manifest["oauth_config"]["scopes"]["bot"]) == tables["bot scope"]
    events = manifest["settings"]["event_subscriptions"]
    assert set(events["bot_events"]) == tables["bot event"]
    urls = [events["request_url"], manifest["settings"]["interactivity"]["request_url"]]
    urls += [c["url"] for c in manifest["features"]["slash_commands"]]
    assert all(u.endswith("/webhooks/slack") for u in urls)
    assert ("POST", "/webhooks/slack") in all_routes()
