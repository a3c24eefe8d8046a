#!/usr/bin/env python3
"""Crash test: SIGKILL the gateway under load, restart it, and check nothing was lost,
answered twice or answered out of order.

Each round starts gateway process(es) on a fresh store (a SQLite file, or a fresh PostgreSQL
schema), then many sessions talk at once: web chat posts and signed WhatsApp webhooks, each
session sending its next message only once the previous one was accepted, and re-sending a
message whose request failed (the platforms redeliver, browsers retry) with the same id. At a
random moment a gateway gets SIGKILL and is restarted on the same port. When the load is done
and every message is answered (or the round's time is up) the gateway is stopped and the store
is read: every accepted message must have exactly one reply, and each session's replies must
come in the order its messages were sent. The model is an echo (`echo: <text>`) and the agent
runs with `queue_mode = "followup"`, so each message maps to exactly one reply.

    .venv/bin/python scripts/crash_test.py --rounds 5 --store sqlite --messages 300 --seed 7

Prints one line per round and a summary; exits 1 on any violation, 2 when a gateway could not
be started. Everything listens on 127.0.0.1 only; every wait is bounded.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import hmac
import itertools
import json
import os
import random
import re
import signal
import socket
import sqlite3
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx
from aiohttp import web

ROOT = Path(__file__).resolve().parent.parent
PG_DEFAULT = os.environ.get("SWITCHBOARD_TEST_POSTGRES", "postgresql://postgres@127.0.0.1/test")
APP_SECRET = "crash-test-app-secret"
WA_NUMBER = "1001"
_USER_MESSAGE = re.compile(r"<user_message>\n?(.*?)\n?</user_message>", re.DOTALL)


# ------------------------------------------------------------------------------------------
# the world around the gateway: an echo model and a WhatsApp Graph API that accepts anything


class Fakes:
    """An OpenAI-compatible echo model and a permissive Graph API, on 127.0.0.1."""

    def __init__(self, rng: random.Random, max_delay_s: float) -> None:
        self.rng, self.max_delay_s = rng, max_delay_s
        self.model_calls = 0
        self.whatsapp_sends = 0
        self.sent_texts: Counter[str] = Counter()  # WhatsApp deliveries per reply text
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._complete)
        app.router.add_post("/graph/{version}/{number}/messages", self._send)
        app.router.add_get("/graph/{version}/{object_id}", self._lookup)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.2)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"

    async def aclose(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _complete(self, request: web.Request) -> web.Response:
        body = await _body(request)
        self.model_calls += 1
        text = ""
        for m in reversed(body.get("messages", [])):
            if m.get("role") == "user":
                found = _USER_MESSAGE.findall(m.get("content") or "")
                text = "\n".join(found) if found else (m.get("content") or "")
                break
        await asyncio.sleep(self.rng.uniform(0, self.max_delay_s))  # kills land mid-run
        return web.json_response(
            {
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": f"echo: {text}"},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 50, "completion_tokens": 5, "total_tokens": 55},
            }
        )

    async def _send(self, request: web.Request) -> web.Response:
        body = await _body(request)
        if body.get("status") == "read":
            return web.json_response({"success": True})
        self.whatsapp_sends += 1
        text = body.get("text", {}).get("body", "") if isinstance(body.get("text"), dict) else ""
        self.sent_texts[text] += 1
        return web.json_response(
            {
                "messaging_product": "whatsapp",
                "contacts": [{"input": body.get("to"), "wa_id": body.get("to")}],
                "messages": [{"id": f"wamid.OUT{uuid.uuid4().hex[:12]}"}],
            }
        )

    async def _lookup(self, request: web.Request) -> web.Response:
        number = request.match_info["object_id"]
        return web.json_response({"display_phone_number": number, "id": number})


async def _body(request: web.Request) -> dict[str, Any]:
    """The JSON body; empty when the gateway was killed while sending it."""
    try:
        body = await request.json()
    except (ConnectionResetError, ValueError):
        return {}
    return body if isinstance(body, dict) else {}


# ------------------------------------------------------------------------------------------
# stores


class StoreKind:
    """A fresh store per round, and a way to read inbox and outbox back."""

    name = ""

    def fresh(self, round_no: int, tmp: Path) -> str:
        raise NotImplementedError

    async def rows(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """(inbox rows, outbox rows), each ordered by id."""
        raise NotImplementedError

    async def drop(self) -> None:
        return None


class SqliteKind(StoreKind):
    name = "sqlite"

    def __init__(self) -> None:
        self.path = Path()

    def fresh(self, round_no: int, tmp: Path) -> str:
        self.path = tmp / f"round{round_no}.db"
        return f"sqlite:///{self.path}"

    async def rows(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        return await asyncio.to_thread(self._rows)

    def _rows(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        with contextlib.closing(sqlite3.connect(f"file:{self.path}?mode=ro", uri=True)) as db:
            db.row_factory = sqlite3.Row
            inbox = db.execute(
                "SELECT id, session, platform_id, payload, status FROM inbox ORDER BY id"
            ).fetchall()
            outbox = db.execute(
                "SELECT id, session, reply, status FROM outbox ORDER BY id"
            ).fetchall()
        return [dict(r) for r in inbox], [dict(r) for r in outbox]


class PostgresKind(StoreKind):
    name = "postgres"

    def __init__(self, base: str) -> None:
        self.base = base
        self.schema = ""

    def fresh(self, round_no: int, tmp: Path) -> str:
        self.schema = f"crash_{uuid.uuid4().hex[:10]}"
        return f"{self.base}?search_path={self.schema}"

    async def create(self) -> None:
        import asyncpg

        conn = await asyncpg.connect(self.base)
        try:
            await conn.execute(f"CREATE SCHEMA {self.schema}")
        finally:
            await conn.close()

    async def rows(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        import asyncpg

        conn = await asyncpg.connect(f"{self.base}?search_path={self.schema}")
        try:
            inbox = await conn.fetch(
                "SELECT id, session, platform_id, payload, status FROM inbox ORDER BY id"
            )
            outbox = await conn.fetch("SELECT id, session, reply, status FROM outbox ORDER BY id")
        finally:
            await conn.close()
        return [dict(r) for r in inbox], [dict(r) for r in outbox]

    async def drop(self) -> None:
        import asyncpg

        conn = await asyncpg.connect(self.base)
        try:
            await conn.execute(f"DROP SCHEMA IF EXISTS {self.schema} CASCADE")
        finally:
            await conn.close()


# ------------------------------------------------------------------------------------------
# gateway processes


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _open_log(path: Path) -> IO[bytes]:
    return path.open("ab")


class GatewayDidNotStart(RuntimeError):
    pass


@dataclass
class Replica:
    config: Path
    port: int
    log: Path
    proc: asyncio.subprocess.Process | None = None
    starts: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def start(self, deadline_s: float = 30.0) -> float:
        """Start the process and wait until it answers /healthz; the seconds it took."""
        started = time.monotonic()
        env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHBOARD__")}
        out = _open_log(self.log)
        try:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "gateway",
                "--log-level",
                "WARNING",
                "--log-format",
                "text",
                "run",
                "--config",
                str(self.config),
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=out,
            )
        finally:
            out.close()
        self.starts += 1
        async with httpx.AsyncClient(timeout=1) as client:
            while time.monotonic() - started < deadline_s:
                if not self.alive:
                    break
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(self.url + "/healthz")).status_code == 200:
                        return time.monotonic() - started
                await asyncio.sleep(0.05)
        await self.kill()
        tail = self.log.read_text(errors="replace")[-3000:]
        raise GatewayDidNotStart(f"gateway on port {self.port} did not start:\n{tail}")

    async def kill(self) -> None:
        if self.alive:
            assert self.proc is not None
            self.proc.send_signal(signal.SIGKILL)
        if self.proc is not None:
            await self.proc.wait()

    async def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM, then SIGKILL if it has not stopped within `grace_s`."""
        if not self.alive:
            return
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(self.proc.wait(), grace_s)
        except TimeoutError:
            await self.kill()


def write_config(path: Path, port: int, store_url: str, fakes: Fakes, data: Path) -> None:
    path.write_text(
        f"[server]\nport = {port}\nshutdown_grace_s = 0.5\nmax_body_bytes = 65536\n"
        f'[store]\nurl = "{store_url}"\nlease_ttl_s = 1.0\npoll_interval_s = 0.2\n'
        f'[model]\nprovider = "openai"\nbase_url = "{fakes.url}/v1"\nname = "echo"\n'
        "stream = false\nmax_retries = 0\ntimeout_s = 10\n"
        '[agent]\nqueue_mode = "followup"\nmax_concurrent_runs = 32\nmax_pending = 1000\n'
        f'knowledge_cache = "{data}/index.json"\nworkspace_dir = "{data}/workspace"\n'
        f'[channels]\nmedia_dir = "{data}/files"\n'
        "[channels.web]\nenabled = true\n"
        "[channels.whatsapp]\nenabled = true\n"
        f'access_token = "crash-test-token"\napp_secret = "{APP_SECRET}"\n'
        f'verify_token = "crash-test-verify"\nphone_number_id = "{WA_NUMBER}"\n'
        f'api_base = "{fakes.url}/graph"\nthroughput_backoff_s = 0.05\npair_backoff_s = 0.05\n'
        "max_per_second = 10000\n",
        encoding="utf-8",
    )


# ------------------------------------------------------------------------------------------
# load


@dataclass
class Session:
    """One conversation: web chat (by cookie) or WhatsApp (by wa_id)."""

    channel: str
    ident: str
    texts: list[str]
    accepted: list[str] = field(default_factory=list)
    attempts: int = 0
    refused: int = 0

    def request(self, text: str, n: int) -> tuple[str, bytes, dict[str, str]]:
        if self.channel == "web":
            body = json.dumps({"text": text, "client_id": f"{self.ident}.m{n}"}).encode()
            headers = {
                "Content-Type": "application/json",
                "Cookie": f"switchboard_chat={self.ident}",
            }
            return "/chat/messages", body, headers
        raw = json.dumps(whatsapp_notification(self.ident, f"wamid.{self.ident}.{n}", text))
        body = raw.encode()
        signature = "sha256=" + hmac.new(APP_SECRET.encode(), body, hashlib.sha256).hexdigest()
        headers = {"Content-Type": "application/json", "X-Hub-Signature-256": signature}
        return "/webhooks/whatsapp", body, headers


def whatsapp_notification(user: str, wamid: str, text: str) -> dict[str, Any]:
    return {
        "object": "whatsapp_business_account",
        "entry": [
            {
                "id": "crash-test-waba",
                "changes": [
                    {
                        "field": "messages",
                        "value": {
                            "messaging_product": "whatsapp",
                            "metadata": {
                                "display_phone_number": WA_NUMBER,
                                "phone_number_id": WA_NUMBER,
                            },
                            "contacts": [{"profile": {"name": "Load"}, "wa_id": user}],
                            "messages": [
                                {
                                    "from": user,
                                    "id": wamid,
                                    "timestamp": str(int(time.time())),
                                    "type": "text",
                                    "text": {"body": text},
                                }
                            ],
                        },
                    }
                ],
            }
        ],
    }


def plan_sessions(
    round_no: int, messages: int, sessions: int, channel: str, rng: random.Random
) -> list[Session]:
    """`messages` messages spread over `sessions` sessions, texts unique in the round."""
    out = []
    tag = f"r{round_no}x{rng.randrange(16**6):06x}"
    for s in range(sessions):
        kind = channel if channel != "mixed" else ("web" if s % 2 == 0 else "whatsapp")
        ident = f"{tag}-web{s:04d}-session" if kind == "web" else f"1555{rng.randrange(10**7):07d}"
        out.append(Session(kind, ident, []))
    for n in range(messages):
        session = out[n % sessions]
        session.texts.append(f"{tag}-s{n % sessions}-m{len(session.texts)}")
    return out


async def converse(
    session: Session,
    replicas: list[Replica],
    client: httpx.AsyncClient,
    rng: random.Random,
    deadline: float,
    progress: asyncio.Event,
) -> None:
    """Send each message, in order, until it is accepted (or the round's time is up)."""
    for n, text in enumerate(session.texts):
        path, body, headers = session.request(text, n)
        while time.monotonic() < deadline:
            live = [r for r in replicas if r.alive] or replicas
            target = rng.choice(live)
            session.attempts += 1
            try:
                resp = await client.post(target.url + path, content=body, headers=headers)
            except httpx.HTTPError:
                session.refused += 1
                await asyncio.sleep(0.05)
                continue
            if resp.status_code in (200, 202):
                session.accepted.append(text)
                progress.set()
                break
            session.refused += 1  # 503 while the store recovers, or a dying process
            await asyncio.sleep(0.05)
        else:
            return
        await asyncio.sleep(rng.uniform(0, 0.01))


# ------------------------------------------------------------------------------------------
# verification


@dataclass
class Findings:
    sent: int = 0
    accepted: int = 0
    answered: int = 0
    duplicates: int = 0
    missing: int = 0
    order_violations: int = 0
    stored_twice: int = 0
    undelivered: int = 0
    unexpected: int = 0
    details: list[str] = field(default_factory=list)

    @property
    def violations(self) -> int:
        return (
            self.duplicates
            + self.missing
            + self.order_violations
            + self.stored_twice
            + self.undelivered
            + self.unexpected
            + (self.sent - self.accepted)
        )


def verify(
    sessions: Sequence[Session], inbox: list[dict[str, Any]], outbox: list[dict[str, Any]]
) -> Findings:
    """Every accepted message answered exactly once, in order per session; nothing stored
    twice; every reply delivered. Reads only the store's rows."""
    f = Findings(
        sent=sum(len(s.texts) for s in sessions),
        accepted=sum(len(s.accepted) for s in sessions),
    )
    order = {text: (s.ident, i) for s in sessions for i, text in enumerate(s.texts)}
    stored: dict[str, int] = defaultdict(int)
    for row in inbox:
        payload = row["payload"]
        text = (json.loads(payload) if isinstance(payload, str) else payload).get("text", "")
        stored[text] += 1
    for text, count in stored.items():
        if count > 1:
            f.stored_twice += count - 1
            f.details.append(f"stored {count} times: {text}")
    replies: dict[str, list[int]] = defaultdict(list)  # session ident -> message indexes
    answers: dict[str, int] = defaultdict(int)
    for row in outbox:
        reply = row["reply"]
        text = (json.loads(reply) if isinstance(reply, str) else reply).get("text", "")
        asked = text.removeprefix("echo: ")
        if asked not in order:
            f.unexpected += 1
            f.details.append(f"a reply to nothing we sent: {text[:80]!r}")
            continue
        answers[asked] += 1
        ident, index = order[asked]
        replies[ident].append(index)
        if row["status"] != "sent":
            f.undelivered += 1
            f.details.append(f"reply {row['id']} is {row['status']}: {text[:80]!r}")
    for s in sessions:
        for text in s.accepted:
            count = answers.get(text, 0)
            if count == 0:
                f.missing += 1
                f.details.append(f"accepted, never answered: {text}")
            elif count > 1:
                f.duplicates += count - 1
                f.details.append(f"answered {count} times: {text}")
            else:
                f.answered += 1
        seen = replies.get(s.ident, [])
        for before, after in itertools.pairwise(seen):
            if after < before:
                f.order_violations += 1
                f.details.append(f"{s.ident}: m{after} answered after m{before}")
    for s in sessions:
        for text in s.texts[len(s.accepted) :]:
            f.details.append(f"never accepted in time: {text}")
    return f


# ------------------------------------------------------------------------------------------
# rounds


@dataclass
class RoundResult:
    number: int
    findings: Findings
    posts: int
    refused: int
    kills: list[str]
    seconds: float
    resent: int = 0  # WhatsApp replies delivered twice (at-least-once delivery; not a violation)


async def run_round(
    number: int, args: argparse.Namespace, kind: StoreKind, fakes: Fakes, tmp: Path
) -> RoundResult:
    rng = random.Random(f"{args.seed}:{number}")
    started = time.monotonic()
    store_url = kind.fresh(number, tmp)
    if isinstance(kind, PostgresKind):
        await kind.create()
    replicas = []
    for i in range(args.replicas):
        config = tmp / f"round{number}-replica{i}.toml"
        port = _free_port()
        write_config(config, port, store_url, fakes, tmp / "data")
        replicas.append(Replica(config, port, tmp / f"round{number}-replica{i}.log"))
    try:
        for replica in replicas:
            await replica.start()
        sessions = plan_sessions(number, args.messages, args.sessions, args.channel, rng)
        total = sum(len(s.texts) for s in sessions)
        deadline = time.monotonic() + args.round_timeout
        progress = asyncio.Event()
        kills: list[str] = []
        limits = httpx.Limits(max_connections=args.sessions + 4)
        async with httpx.AsyncClient(timeout=5, limits=limits) as client:
            load = asyncio.gather(
                *(converse(s, replicas, client, rng, deadline, progress) for s in sessions)
            )
            points = sorted(rng.uniform(0.15, 0.85) for _ in range(args.kills))
            for point in points:
                while not load.done() and time.monotonic() < deadline:
                    accepted = sum(len(s.accepted) for s in sessions)
                    if accepted >= point * total:
                        break
                    progress.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(progress.wait(), 0.5)
                if load.done():
                    break
                await asyncio.sleep(rng.uniform(0, 0.05))  # a random moment, not a boundary
                victim = rng.choice([r for r in replicas if r.alive])
                at = time.monotonic() - started
                accepted = sum(len(s.accepted) for s in sessions)
                await victim.kill()
                took = await victim.start()
                kills.append(f"{at:.2f}s ({accepted} accepted), back in {took:.1f}s")
            await load
        await wait_answered(kind, sessions, deadline)
    finally:
        for replica in replicas:
            await replica.stop()
    inbox, outbox = await kind.rows()
    findings = verify(sessions, inbox, outbox)
    await kind.drop()
    replies = [f"echo: {t}" for s in sessions if s.channel == "whatsapp" for t in s.accepted]
    return RoundResult(
        number,
        findings,
        posts=sum(s.attempts for s in sessions),
        refused=sum(s.refused for s in sessions),
        kills=kills,
        seconds=time.monotonic() - started,
        resent=sum(max(0, fakes.sent_texts[r] - 1) for r in replies),
    )


async def wait_answered(kind: StoreKind, sessions: list[Session], deadline: float) -> None:
    """Until every accepted message has a delivered reply, or the round's time is up."""
    wanted = {f"echo: {t}" for s in sessions for t in s.accepted}
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):  # the store may be between writers
            _, outbox = await kind.rows()
            done = {
                (json.loads(r["reply"]) if isinstance(r["reply"], str) else r["reply"])["text"]
                for r in outbox
                if r["status"] == "sent"
            }
            if wanted <= done:
                return
        await asyncio.sleep(0.2)


def report(result: RoundResult, rounds: int, store: str) -> str:
    f = result.findings
    kills = "; ".join(result.kills) or "no kill (load ended first)"
    return (
        f"round {result.number}/{rounds} [{store}] sent {f.sent}, accepted {f.accepted} "
        f"({result.posts} posts, {result.refused} refused or failed) | killed at {kills} | "
        f"answered {f.answered}, duplicates {f.duplicates}, missing {f.missing}, "
        f"order violations {f.order_violations}, stored twice {f.stored_twice}, "
        f"undelivered {f.undelivered}, unexpected {f.unexpected} | WhatsApp re-sends after a "
        f"kill {result.resent} | {result.seconds:.1f}s"
    )


@contextlib.contextmanager
def workdir(keep: bool) -> Iterator[Path]:
    if keep:
        path = Path(tempfile.mkdtemp(prefix="crash-test-"))
        print(f"keeping logs and stores in {path}")
        yield path
    else:
        with tempfile.TemporaryDirectory(prefix="crash-test-") as name:
            yield Path(name)


async def main_async(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    kind: StoreKind = SqliteKind() if args.store == "sqlite" else PostgresKind(args.pg_url)
    fakes = Fakes(rng, args.model_delay)
    await fakes.start()
    failed = 0
    results: list[RoundResult] = []
    try:
        with workdir(args.keep) as tmp:
            for number in range(1, args.rounds + 1):
                try:
                    result = await run_round(number, args, kind, fakes, tmp)
                except GatewayDidNotStart as exc:
                    print(f"round {number}: {exc}", file=sys.stderr)
                    return 2
                results.append(result)
                print(report(result, args.rounds, kind.name), flush=True)
                for line in result.findings.details[:20]:
                    print(f"    {line}")
                failed += result.findings.violations > 0
    finally:
        await fakes.aclose()
    sent = sum(r.findings.sent for r in results)
    answered = sum(r.findings.answered for r in results)
    kills = sum(len(r.kills) for r in results)
    verdict = "OK" if failed == 0 else f"FAILED ({failed} round(s) with violations)"
    print(
        f"crash test [{kind.name}, seed {args.seed}]: {len(results)} rounds, {kills} kills, "
        f"{sent} messages, {answered} answered exactly once in order: {verdict}"
    )
    return 0 if failed == 0 else 1


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--store", choices=("sqlite", "postgres"), default="sqlite")
    p.add_argument("--messages", type=int, default=200, help="per round, over all sessions")
    p.add_argument("--sessions", type=int, default=20)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--kills", type=int, default=1, help="SIGKILLs per round")
    p.add_argument("--replicas", type=int, default=1, help="gateway processes (postgres: >1)")
    p.add_argument("--channel", choices=("web", "whatsapp", "mixed"), default="mixed")
    p.add_argument("--model-delay", type=float, default=0.05, help="max seconds per model call")
    p.add_argument("--round-timeout", type=float, default=90.0, help="seconds per round")
    p.add_argument("--pg-url", default=PG_DEFAULT, help="PostgreSQL server (a schema per round)")
    p.add_argument("--keep", action="store_true", help="keep logs and stores")
    args = p.parse_args(argv)
    if args.replicas > 1 and args.store != "postgres":
        p.error("several replicas need --store postgres")
    if args.rounds < 1 or args.messages < 1 or args.sessions < 1 or args.kills < 0:
        p.error("--rounds, --messages and --sessions must be positive, --kills not negative")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    return asyncio.run(main_async(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
