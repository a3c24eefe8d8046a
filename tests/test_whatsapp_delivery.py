"""WhatsApp end to end, outbound: chunks, buttons, the 24-hour window, errors, statuses."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import pytest
import pytest_asyncio

from tests.fake_openai import FakeOpenAI, Text, ToolCalls, last_user_text
from tests.fake_whatsapp import (
    Failure,
    FakeGraph,
    Gateway,
    payload,
    running_gateway,
    text_message,
    until,
)

USER = "15551234567"
TEMPLATE = '\ntemplate_name = "reply_later"\ntemplate_language = "es"\n'
Start = Callable[..., AbstractAsyncContextManager[Gateway]]


@pytest_asyncio.fixture
async def graph() -> AsyncIterator[FakeGraph]:
    fake = FakeGraph()
    await fake.start()
    yield fake
    await fake.aclose()


@pytest_asyncio.fixture
async def gw(tmp_path: Path, graph: FakeGraph, fake_openai: FakeOpenAI) -> AsyncIterator[Gateway]:
    async with running_gateway(tmp_path, graph, fake_openai.url) as gateway:
        yield gateway


@pytest.fixture
def start(tmp_path: Path, graph: FakeGraph, fake_openai: FakeOpenAI) -> Start:
    """A gateway with extra [channels.whatsapp] keys."""
    return lambda extra: running_gateway(tmp_path, graph, fake_openai.url, extra)


def buttons(*labels: str) -> ToolCalls:
    args = {"buttons": [{"label": label, "value": f"v-{i}"} for i, label in enumerate(labels)]}
    return ToolCalls([("send_buttons", json.dumps(args))])


async def test_a_10000_character_reply_arrives_in_order_in_chunks(
    gw: Gateway, fake_openai: FakeOpenAI
) -> None:
    code = "\n".join(f"row {i:03d} = {'#' * 40}" for i in range(60))
    paragraphs = [f"Part {i}: " + "lorem ipsum dolor " * 25 for i in range(18)]
    reply = "\n\n".join([*paragraphs[:9], f"```\n{code}\n```", *paragraphs[9:]])
    assert len(reply) > 10_000
    fake_openai.responder = lambda body: Text(reply)
    await gw.notify(text_message("tell me everything"))
    await until(lambda: "Part 17" in "".join(gw.graph.texts(USER)))
    chunks = gw.graph.texts(USER)
    assert len(chunks) == 3
    assert all(len(c) <= 4096 and c.count("```") % 2 == 0 for c in chunks)
    joined = "\n\n".join(chunks)
    assert [int(n) for n in re.findall(r"Part (\d+):", joined)] == list(range(18))
    assert re.findall(r"row (\d+)", joined) == [f"{i:03d}" for i in range(60)]


async def test_chunks_already_sent_are_not_resent_on_retry(
    gw: Gateway, fake_openai: FakeOpenAI
) -> None:
    fake_openai.responder = lambda body: Text(
        "\n\n".join(f"Block {i} " + "x" * 3000 for i in range(3))
    )
    gw.graph.fail(None, Failure(131000, status=500, message="Something went wrong"))
    await gw.notify(text_message("long please"))
    await until(lambda: len(gw.graph.texts(USER)) == 3)
    assert [t.split()[1] for t in gw.graph.texts(USER)] == ["0", "1", "2"]
    assert len(gw.graph.attempts) == 4
    await until(lambda: _status(gw, 1, "sent"))
    assert await gw.store.delivery(1) == (
        "sent",
        None,
        "WhatsApp error 131000: (#131000) Something went wrong",
    )
    assert await gw.store.kv_get("whatsapp.sent", "1") is None  # nothing left to resume


async def test_buttons_within_the_limits_are_interactive(
    gw: Gateway, fake_openai: FakeOpenAI
) -> None:
    fake_openai.script(buttons("Yes", "No"), Text("Book it?"))
    await gw.notify(text_message("book a table", mid="wamid.A"))
    await until(lambda: gw.graph.to(USER))
    inter = gw.graph.sent[0]["interactive"]
    assert inter["type"] == "button"
    assert inter["body"] == {"text": "Book it?"}
    assert [b["reply"] for b in inter["action"]["buttons"]] == [
        {"id": "v-0", "title": "Yes"},
        {"id": "v-1", "title": "No"},
    ]
    sizes = [f"Size {s}" for s in ("small", "medium", "large", "family")]
    fake_openai.script(buttons(*sizes), Text("Which size?"))
    await gw.notify(text_message("pizza", mid="wamid.B"))
    await until(lambda: len(gw.graph.to(USER)) == 2)
    inter = gw.graph.sent[1]["interactive"]
    assert inter["type"] == "list"
    assert [r["title"] for r in inter["action"]["sections"][0]["rows"]] == sizes
    assert inter["action"]["button"] == "Options"


async def test_buttons_beyond_the_limits_are_a_menu_answered_by_number(
    gw: Gateway, fake_openai: FakeOpenAI
) -> None:
    labels = [f"Delivery on weekday number {i}" for i in range(1, 5)]  # > 24 characters
    fake_openai.script(buttons(*labels), Text("When shall we deliver?"))
    await gw.notify(text_message("deliver", mid="wamid.A"))
    await until(lambda: gw.graph.texts(USER))
    (menu,) = gw.graph.texts(USER)
    assert menu == "When shall we deliver?\n\nPlease choose:\n" + "\n".join(
        f"{i}. {label}" for i, label in enumerate(labels, 1)
    )
    await gw.notify(text_message("2", mid="wamid.B"))
    await until(lambda: len(gw.graph.texts(USER)) == 2)
    chosen = last_user_text(fake_openai.requests[-1])
    assert chosen == f"[pressed the button: {labels[1]} (value: v-1)]"
    await gw.notify(text_message("2", mid="wamid.C"))  # that reply had no menu: a plain "2"
    await until(lambda: len(gw.graph.texts(USER)) == 3)
    assert last_user_text(fake_openai.requests[-1]) == "2"


async def test_window_closed_sends_the_template(start: Start, graph: FakeGraph) -> None:
    async with start(TEMPLATE) as gw:
        day_ago = time.time() - 25 * 3600
        await gw.notify(text_message("sorry for the late reply", ts=day_ago))
        await until(lambda: graph.sent)
        (sent,) = graph.sent
        assert sent["type"] == "template"
        tpl = sent["template"]
        assert (tpl["name"], tpl["language"]) == ("reply_later", {"code": "es"})
        param = tpl["components"][0]["parameters"][0]
        assert param == {"type": "text", "text": "echo: sorry for the late reply"}
        assert graph.attempts == [{k: v for k, v in sent.items() if not k.startswith("_")}]


async def test_window_closed_without_template_is_held_for_the_operator(
    gw: Gateway, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR)
    await gw.notify(text_message("hello?", ts=time.time() - 25 * 3600))
    await until(lambda: _status(gw, 1, "failed"))
    assert gw.graph.attempts == []
    assert "no template is configured" in caplog.text


async def test_re_engagement_error_takes_the_template_path(start: Start, graph: FakeGraph) -> None:
    graph.fail(Failure(131047, message="Re-engagement message"))
    async with start(TEMPLATE) as gw:
        await gw.notify(text_message("hi"))
        await until(lambda: graph.sent)
        assert [a["type"] for a in graph.attempts] == ["text", "template"]
        await until(lambda: _status(gw, 1, "sent"))


async def test_the_window_closing_mid_reply_sends_only_the_rest_as_the_template(
    start: Start, graph: FakeGraph, fake_openai: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    """131047 on a long reply's second message: the template carried the whole reply from
    its start (the first message again, cut at 1,024 characters) and the rest never came.
    What a template cannot carry is said in the log for the operator."""
    fake_openai.responder = lambda body: Text(
        "\n\n".join(f"Block {i} " + "x" * 3000 for i in range(3))
    )
    graph.fail(None, Failure(131047, message="Re-engagement message"))
    caplog.set_level(logging.WARNING)
    async with start(TEMPLATE) as gw:
        await gw.notify(text_message("long please"))
        await until(lambda: len(graph.sent) == 2)
        await until(lambda: _status(gw, 1, "sent"))
        assert [m["type"] for m in graph.sent] == ["text", "template"]
        assert graph.sent[0]["text"]["body"].startswith("Block 0")
        (param,) = graph.sent[1]["template"]["components"][0]["parameters"]
        assert param["text"].startswith("Block 1 xxx")
        assert len(param["text"]) <= 1024
        assert await gw.store.kv_get("whatsapp.sent", "1") is None
    assert "goes out as template reply_later, which carries at most 1024" in caplog.text


@pytest.mark.parametrize("code", [130429, 131056])
async def test_rate_limits_back_off_then_deliver(gw: Gateway, code: int) -> None:
    gw.graph.fail(Failure(code, message="Rate limit hit"))
    started = time.monotonic()
    await gw.notify(text_message("hello"))
    await until(lambda: gw.graph.texts(USER))
    assert time.monotonic() - started >= 0.3  # throughput_backoff_s / pair_backoff_s
    assert len(gw.graph.attempts) == 2
    await until(lambda: _status(gw, 1, "sent"))


async def test_permanent_errors_are_recorded_not_retried(
    gw: Gateway, caplog: pytest.LogCaptureFixture
) -> None:
    gw.graph.fail(Failure(131026, message="Message undeliverable"))
    await gw.notify(text_message("hello", mid="wamid.A"))
    await until(lambda: _status(gw, 1, "failed"))
    delivery = await gw.store.delivery(1)
    assert delivery is not None
    assert "131026" in (delivery[2] or "")
    await asyncio.sleep(0.3)
    assert len(gw.graph.attempts) == 1


async def test_a_rejected_token_is_an_operator_alert(
    gw: Gateway, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR)
    gw.graph.fail(Failure(190, status=401, message="Error validating access token"))
    await gw.notify(text_message("hello"))
    await until(lambda: _status(gw, 1, "failed"))
    assert len(gw.graph.attempts) == 1
    assert "access token rejected" in caplog.text


async def test_statuses_update_the_delivery_state(gw: Gateway) -> None:
    await gw.notify(text_message("hello"))
    await until(lambda: gw.graph.sent)
    await until(lambda: _status(gw, 1, "sent"))
    wamid = gw.graph.sent[0]["_id"]
    report = payload("statuses")
    statuses = report["entry"][0]["changes"][0]["value"]["statuses"]
    statuses[0]["id"] = wamid
    assert (await gw.notify(report)).status_code == 200
    assert await gw.store.delivery(1) == ("sent", "delivered", None)
    statuses[1]["id"] = wamid
    statuses[0]["id"] = "wamid.NOT-OURS"
    assert (await gw.notify(report)).status_code == 200
    assert await gw.store.delivery(1) == ("sent", "failed", "131026: Message undeliverable")


async def _status(gw: Gateway, part_id: int, status: str) -> bool:
    delivery = await gw.store.delivery(part_id)
    return delivery is not None and delivery[0] == status
