"""`switchboard run | chat | check | telegram set-webhook | pairing list | pairing approve`:
config errors are messages naming keys, never tracebacks."""

from __future__ import annotations

import argparse
import asyncio
import errno
import gc
import logging
import os
import re
import socket
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.web_runner import GracefulExit

from channels.base import LINGER_S
from channels.console import Console
from core.access import approve, for_how_long, pending_codes
from core.errors import ChannelError, ConfigError, StoreError
from gateway.app import build_app
from gateway.config_checks import secret_values, settings_warnings
from gateway.config_keys import env_source
from gateway.logs import json_line, logs_json, redact, setup_logging
from gateway.probes import Probe, probe_all, webhook_urls
from gateway.runtime import Runtime, build_store
from gateway.settings import (
    DEFAULT_CONFIG,
    EXAMPLE_CONFIG,
    Settings,
    config_path,
    load_settings,
)

__all__ = ["main"]

log = logging.getLogger("switchboard")
EXIT_CONFIG = 2
# net new container objects between young collections (CPython's default is 700); 10,000 runs in
# flight keep many young objects alive, and at 10,000 collection took 8 % of the CPU, at 50,000 1 %
GC_YOUNG_THRESHOLD = 50_000


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
LOG_FORMATS = ("auto", "json", "text")


def _one_of(allowed: Sequence[str], env: str, fold: Callable[[str], str]) -> Callable[[str], str]:
    def check(value: str) -> str:
        value = fold(value)
        if value not in allowed:
            raise argparse.ArgumentTypeError(
                f"{value!r} is not one of {', '.join(allowed)} (also read from {env})"
            )
        return value

    return check


def _log_options(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """--log-level and --log-format, before the command or after it (there, only when given:
    SUPPRESS keeps the one given before, or the environment's)."""
    # `type`, not `choices`: argparse checks a default taken from the environment only so
    parser.add_argument(
        "--log-level",
        type=_one_of(LOG_LEVELS, "SWITCHBOARD_LOG_LEVEL", str.upper),
        default=os.environ.get("SWITCHBOARD_LOG_LEVEL", "INFO") if top else argparse.SUPPRESS,
        help=f"{', '.join(LOG_LEVELS)} (default: INFO, or SWITCHBOARD_LOG_LEVEL)",
    )
    parser.add_argument(
        "--log-format",
        type=_one_of(LOG_FORMATS, "SWITCHBOARD_LOG_FORMAT", str.lower),
        default=os.environ.get("SWITCHBOARD_LOG_FORMAT", "auto") if top else argparse.SUPPRESS,
        help="auto: readable in a terminal, one JSON object per line otherwise",
    )


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:  # the reader went away (`switchboard check | head -1`)
        _drop_stdout()
        return 1


def _drop_stdout() -> None:
    """Point stdout at /dev/null once its reader is gone: no second BrokenPipeError when
    Python flushes it at exit."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _main(argv: Sequence[str] | None) -> int:
    parser = argparse.ArgumentParser(
        prog="switchboard", description="One AI agent on WhatsApp, Telegram, Slack and the web."
    )
    _log_options(parser, top=True)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, text in (
        ("run", "serve the gateway"),
        ("chat", "talk to the agent in this terminal"),
        ("check", "validate the configuration and report each problem by key"),
    ):
        cmd = sub.add_parser(name, help=text, description=text)
        cmd.add_argument("--config", metavar="FILE", help=f"TOML file (default: {DEFAULT_CONFIG})")
        _log_options(cmd, top=False)
    sub.choices["check"].add_argument(
        "--offline", action="store_true", help="only validate; do not try credentials online"
    )
    sub.choices["check"].add_argument(
        "--strict", action="store_true", help="exit 1 when a live check fails"
    )
    telegram = sub.add_parser("telegram", help="Telegram bot operations")
    tg_sub = telegram.add_subparsers(dest="telegram_command", required=True)
    text = "register server.public_url + /webhooks/telegram with Telegram (setWebhook)"
    cmd = tg_sub.add_parser("set-webhook", help=text, description=text)
    cmd.add_argument("--config", metavar="FILE", help=f"TOML file (default: {DEFAULT_CONFIG})")
    _log_options(cmd, top=False)
    pairing = sub.add_parser("pairing", help="approve people who asked to talk to the agent")
    pair_sub = pairing.add_subparsers(dest="pairing_command", required=True)
    cmd = pair_sub.add_parser("list", help="pairing codes waiting for approval")
    cmd.add_argument("--config", metavar="FILE", help=f"TOML file (default: {DEFAULT_CONFIG})")
    _log_options(cmd, top=False)
    cmd = pair_sub.add_parser("approve", help="approve a pairing code; their messages get answered")
    cmd.add_argument("code")
    cmd.add_argument("--config", metavar="FILE", help=f"TOML file (default: {DEFAULT_CONFIG})")
    _log_options(cmd, top=False)
    args = parser.parse_args(argv)
    setup_logging(args.log_level, args.log_format)
    as_log = args.command == "run"  # the service's log: one format, JSON under systemd
    try:  # pairing needs only the store, not every channel's secrets in its environment
        only = ("store",) if args.command == "pairing" else None
        settings = load_settings(args.config, only=only)
    except ConfigError as exc:
        _print_problems(exc.problems, args.config, as_log=as_log)
        return EXIT_CONFIG
    redact(secret_values(settings))
    for key, msg in settings_warnings(settings):
        if as_log:
            log.warning("config: %s: %s", key, msg)
        else:
            print(f"warning: {key}: {msg}", file=sys.stderr)
    if args.command == "check":
        return _check(settings, args.config, offline=args.offline, strict=args.strict)
    if args.command == "telegram":
        return asyncio.run(_telegram_set_webhook(settings, args.config))
    try:
        if args.command == "pairing":
            if _no_sqlite_file(settings):
                return EXIT_CONFIG
            return asyncio.run(_pairing(settings, args.pairing_command, getattr(args, "code", "")))
        if args.command == "run":
            return _run(settings)
        return asyncio.run(_chat(settings))
    except ConfigError as exc:  # e.g. server.host or server.port cannot be bound
        _print_problems(exc.problems, args.config, as_log=as_log)
        return EXIT_CONFIG
    except StoreError as exc:  # the store named by the URL cannot be opened (never printed:
        # it may hold a password)
        _print_error(": ".join(_named("store.url", str(exc))), as_log=as_log)
        return EXIT_CONFIG
    except KeyboardInterrupt:
        return 130


def _no_sqlite_file(settings: Settings) -> bool:
    """A SQLite store that does not exist is not made by an operator's command: run as another
    user (root), it would leave a file the gateway cannot write."""
    if not settings.store.url.startswith("sqlite:") or os.path.exists(settings.sqlite_path()):
        return False
    print(
        f"error: store.url: no store at {settings.sqlite_path()} (has the gateway run with this"
        f" configuration, from this directory?){env_source('store.url', os.environ)}",
        file=sys.stderr,
    )
    return True


async def _pairing(settings: Settings, command: str, code: str) -> int:
    """The operator's side of pairing: list waiting codes, or approve one."""
    store = build_store(settings)
    await store.start()
    try:
        if command == "list":
            codes = await pending_codes(store)
            for c, entry in sorted(codes.items()):
                left = for_how_long(float(str(entry["expires"])) - time.time())
                print(f"{c}  {entry['channel']}:{entry['sender']}  expires in {left}")
            if not codes:
                print("no pairing codes are waiting")
            return 0
        approved = await approve(store, code)
    finally:
        await store.aclose()
    if approved is None:
        print(f"error: no waiting pairing code {code!r} (wrong or expired)", file=sys.stderr)
        return 1
    print(f"approved {approved[0]}:{approved[1]}; their kept messages will now be answered")
    return 0


def _without_password(url: str) -> str:
    """A database URL fit to print: any password replaced by ***."""
    return re.sub(r"(//[^:/@]+:)[^@]*@", r"\1***@", url)


def _print_problems(
    problems: list[tuple[str, str]], path: str | None, *, as_log: bool = False
) -> None:
    """On stderr: a heading and a line per problem, or, as_log where the log is JSON lines,
    one JSON line per problem (the plain lines among them broke what reads the log)."""
    where = config_path(path)
    if where is None:  # e.g. run outside the checkout: the defaults' relative paths miss too
        where_text = f"no file: neither {DEFAULT_CONFIG} nor {EXAMPLE_CONFIG} in {Path.cwd()}"
    else:
        where_text = str(where)
    if as_log and logs_json():
        for key, msg in problems:
            log.error("config error (%s): %s: %s", where_text, key, msg)
        return
    print(f"config error ({where_text}):", file=sys.stderr)
    for key, msg in problems:
        print(f"  {key}: {msg}", file=sys.stderr)


def _print_error(text: str, *, as_log: bool = False) -> None:
    """ "error: …" on stderr, or, as_log where the log is JSON lines, a JSON line."""
    if as_log and logs_json():
        log.error("error: %s", text)
    else:
        print(f"error: {text}", file=sys.stderr)


def _check(settings: Settings, path: str | None, *, offline: bool, strict: bool) -> int:
    """Exit 0 for a valid configuration (2 is for invalid ones, before this); live checks that
    fail are reported, and exit 1 only with --strict."""
    s = settings
    in_use = None
    probes: list[Probe] = []
    if not offline:
        try:
            in_use = _try_listen(s.server.host, s.server.port)
        except ConfigError as exc:
            _print_problems(exc.problems, path)
            return EXIT_CONFIG
        probes = asyncio.run(probe_all(s))
    store = next((p for p in probes if p.name == "store (PostgreSQL)" and not p.ok), None)
    # run refuses to start without it (exit 2): so does check, found before any "config ok"
    # (it said so, then failed)
    if store is not None:
        _print_probes(probes)
        _print_problems([_named("store.url", store.detail)], path)
        return EXIT_CONFIG
    print(f"config ok: {config_path(path) or 'built-in defaults'}")
    if in_use:  # most likely the gateway this check comes before a restart of
        print(f"note: {in_use}", file=sys.stderr)
    enabled = [
        n for n in ("web", "telegram", "slack", "whatsapp") if getattr(s.channels, n).enabled
    ]
    print(f"  store: {_without_password(s.store.url)}")
    print(f"  model: {s.model.provider}" + (f" ({s.model.name})" if s.model.name else ""))
    print(f"  channels: {', '.join(enabled) or 'none'}")
    if s.channels.web.enabled:
        print(f"  web chat: {_url(s.server.host, s.server.port)}")
    urls = webhook_urls(s)
    if urls:
        print("webhook URLs to configure:")
        for platform, url in urls:
            print(f"  {platform}: {url}")
    _print_probes(probes)
    if all(p.ok for p in probes):
        return 0
    print("warning: some live checks failed (see above)", file=sys.stderr)
    return 1 if strict else 0


def _print_probes(probes: list[Probe]) -> None:
    if probes:
        print("live checks:")
    for probe in probes:
        print(f"  {probe.name}: {'ok' if probe.ok else 'FAILED'}: {probe.detail}")


async def _telegram_set_webhook(settings: Settings, path: str | None) -> int:
    from channels.telegram import set_webhook, webhook_problems  # PTB loads only when needed

    section, public_url = settings.channels.telegram, settings.server.public_url
    problems = webhook_problems(section, public_url)
    if problems or public_url is None:
        _print_problems([_named(k, m) for k, m in problems], path)
        return EXIT_CONFIG
    try:
        url = await set_webhook(section, public_url)
    except ChannelError as exc:
        print(f"error: setWebhook failed: {exc}", file=sys.stderr)
        return 1
    updates = ", ".join(section.allowed_updates) or "Telegram's default"
    print(f"webhook set: {url}")
    print(f"  allowed_updates: {updates}")
    print("  secret token: set (sent back as X-Telegram-Bot-Api-Secret-Token)")
    return 0


def _serving(url: str) -> None:
    """Say where it serves, on stdout as ever: where the log is JSON (systemd, Docker) as a
    JSON line like the log's, so that whatever collects stdout and stderr reads JSON."""
    if logs_json():
        print(json_line(log, f"Switchboard serving on {url}"), flush=True)
    else:
        print(f"Switchboard serving on {url} (Ctrl+C to stop)")


IDLE_S = 75.0


def _run(settings: Settings) -> int:
    host = settings.server.host
    sockets = _listen(host, settings.server.port)  # before anything starts
    port = sockets[0].getsockname()[1]  # the one the system chose for port 0
    try:
        app = build_app(settings)
        app.on_startup.append(settle_heap)  # after the runtime and the channels have started
        web.run_app(
            app,
            sock=sockets,
            shutdown_timeout=5.0,
            access_log=None,
            lingering_time=LINGER_S,  # then a 408's connection closes (aiohttp's default: 10 s)
            # a connection with no whole request for this long is closed: one that never ends its
            # headers, or sits idle (aiohttp's default, an hour, let one client hold every file
            # descriptor); longer than a proxy's idle upstream connections (nginx: 60 s)
            keepalive_timeout=IDLE_S,
            print=lambda _: _serving(_url(host, port)),
        )
    except GracefulExit:  # a second SIGTERM or Ctrl+C during the drain cut it short
        log.warning(
            "stopped by a second signal before the running turns ended; their messages stay "
            "stored and are answered after the next start"
        )
    finally:
        for sock in sockets:
            sock.close()
    return 0


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


_AddrInfo = tuple[socket.AddressFamily, socket.SocketKind, int, str, tuple[Any, ...]]


def _resolve(host: str, port: int) -> list[_AddrInfo]:
    """The addresses to listen on, or ConfigError naming server.host."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as exc:
        reason = getattr(exc, "strerror", None) or exc
        problem = _named("server.host", f"cannot resolve {host!r}: {reason}")
        raise ConfigError([problem]) from None
    return list(dict.fromkeys(infos))  # a name can resolve to one address twice


def _listen(host: str, port: int) -> list[socket.socket]:
    """Listening sockets for server.host and server.port (one per address, as asyncio makes
    them), so a bad host or a port in use is a problem by key rather than a traceback
    mid-start."""
    sockets: list[socket.socket] = []
    try:
        for family, _, _, _, address in _resolve(host, port):
            try:
                sockets.append(socket.create_server(address, family=family))
            except OSError as exc:
                raise ConfigError([_bind_problem(exc, host, port, address[0])]) from None
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def _try_listen(host: str, port: int) -> str | None:
    """What `run` would find listening on server.host and server.port: a ConfigError by key
    for what stops it, or a note when something listens there now."""
    for family, _, _, _, address in _resolve(host, port):
        try:
            socket.create_server(address, family=family).close()
        except OSError as exc:
            key, msg = _bind_problem(exc, host, port, address[0])
            if exc.errno == errno.EADDRINUSE:
                return f"{key}: {msg}"
            raise ConfigError([(key, msg)]) from None
    return None


def _bind_problem(exc: OSError, host: str, port: int, address: str) -> tuple[str, str]:
    return _named(*_bind_reason(exc, host, port, address))


def _named(key: str, msg: str) -> tuple[str, str]:
    """A problem found here, after the configuration was read, naming the variables that set
    its key as load_settings does: "cannot resolve" named no SWITCHBOARD__SERVER__HOST."""
    return key, msg + env_source(key, os.environ)


def _bind_reason(exc: OSError, host: str, port: int, address: str) -> tuple[str, str]:
    if exc.errno == errno.EADDRINUSE:
        return "server.port", (
            f"{port} is already in use on {address}; stop what listens there or choose another port"
        )
    if exc.errno == errno.EADDRNOTAVAIL:
        shown = host if host == address else f"{host} ({address})"
        return "server.host", f"{shown} is not an address of this machine"
    if exc.errno == errno.EACCES:
        return "server.port", f"{port} needs privileges on {address}; choose a port above 1023"
    return "server.host", f"cannot listen on {address} port {port}: {exc.strerror or exc}"


async def settle_heap(app: web.Application | None = None) -> None:
    """Startup is over, and what it built (settings, indexes, schemas, routes) lives as long
    as the process: the cyclic collector stops re-scanning it, and collects young objects less
    often (almost all are freed by reference counting anyway). Measured under load: full
    collections of the startup heap took about 44 ms each, and collection 3 % of the CPU."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, 10, 10)


async def _chat(settings: Settings) -> int:
    if sys.stdin is None:  # started with stdin closed (`<&-`): nothing to read the chat from
        print("error: chat reads what you type from stdin, which is closed", file=sys.stderr)
        return 1
    console = Console(user=os.environ.get("USER") or "you")
    runtime = Runtime.build(settings, {console.name: console})
    for handler in logging.getLogger().handlers:  # a log line never ends an answer's line
        handler.addFilter(_before_each(console.end_line))
    await runtime.start()
    if sys.stdin.isatty():
        print("Chatting with the agent. /reset starts over, Ctrl+D quits.")
    try:
        async for line in _stdin_lines():
            if console.gone:
                break
            msg = console.parse(line)
            if msg is not None:
                await runtime.manager.submit(msg)
        await runtime.manager.wait_idle()
    finally:
        await runtime.aclose()
    if console.gone:
        _drop_stdout()
        return 1
    return 0


def _before_each(call: Callable[[], None]) -> Callable[[logging.LogRecord], bool]:
    """A logging filter that lets every record through, after `call`."""

    def first(_: logging.LogRecord) -> bool:
        call()
        return True

    return first


async def _stdin_lines() -> AsyncIterator[str]:
    """stdin's lines until its end, read by a daemon thread: Ctrl+C ends the chat at once (a
    read blocked in asyncio's own executor would hold the exit until the next Enter)."""
    loop = asyncio.get_running_loop()
    lines: asyncio.Queue[str] = asyncio.Queue()

    def read() -> None:
        while True:
            line = sys.stdin.readline()
            try:
                loop.call_soon_threadsafe(lines.put_nowait, line)
            except RuntimeError:  # the loop is closed: the chat is over
                return
            if not line:
                return

    threading.Thread(target=read, name="stdin", daemon=True).start()
    while line := await lines.get():
        yield line
