"""The console and the web chat in a real browser: Debian's Chromium, headless, via Playwright.

Never downloads a browser: CI installs Chromium with `apt-get install -y chromium`. Without it
these tests fail (they are never skipped). Screenshots go to the test's tmp_path."""

from __future__ import annotations

import os
import re
import shutil
import ssl
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from core.models import InboundMessage, Sender, SessionKey
from gateway.app import build_app
from gateway.settings import load_settings
from tests.fake_openai import FakeOpenAI, Text, ToolCalls, last_user_text
from tests.loopback import serve
from tests.test_admin import TOKEN, chat_browser, config, gateway, replies, say, until

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
STEP_MS = 10_000  # the longest any one thing may take to show up


def _require_chromium() -> None:
    if not CHROMIUM.exists():
        pytest.fail(
            f"Chromium is missing at {CHROMIUM}: install it with `apt-get install -y chromium`"
            " (these tests drive Debian's browser and never download one)"
        )


@pytest.fixture
async def chromium() -> AsyncIterator[Any]:
    _require_chromium()
    try:
        from playwright.async_api import async_playwright
    except ImportError:
        pytest.fail("the playwright package is missing: pip install -e '.[test]'")
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            await browser.close()


class Screens:
    """Numbered screenshots in the test's folder; copied to tests/artifacts when asked."""

    def __init__(self, page: Any, folder: Path) -> None:
        self.page, self.folder, self.count = page, folder, 0
        folder.mkdir(parents=True, exist_ok=True)

    async def shot(self, name: str) -> Path:
        self.count += 1
        path = self.folder / f"{self.count:02d}-{name}.png"
        await self.page.screenshot(path=str(path), full_page=False)
        return path


async def _page(browser: Any) -> tuple[Any, list[str]]:
    """A page (of the browser, or of one browser context) that records script errors and
    console errors (a CSP violation is one)."""
    page = await browser.new_page()
    await page.set_viewport_size({"width": 1280, "height": 800})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(f"pageerror: {exc}"))
    page.on("console", lambda m: _console_error(m, errors))
    page.set_default_timeout(STEP_MS)
    return page, errors


async def test_operator_takes_over_a_conversation(
    tmp_path: Path, fake_openai: FakeOpenAI, chromium: Any
) -> None:
    fake_openai.script(ToolCalls([("search_knowledge", '{"query": "repairs"}')], delay_s=0.6))
    fake_openai.responder = lambda body: Text(f"echo: {last_user_text(body)}", delay_s=0.6)
    async with gateway(config(tmp_path, model_url=fake_openai.url)) as gw:
        page, errors = await _page(chromium)
        screens = Screens(page, tmp_path / "screens")
        await page.goto(gw.url + "/admin")
        await page.locator("#login-form").wait_for()
        await page.fill("#token", "not-the-token")
        await page.click("#login-submit")
        await page.get_by_text("wrong admin token").wait_for()
        await page.fill("#token", TOKEN)
        await page.click("#login-submit")
        await page.locator("#tabs").wait_for()
        await page.locator("#live.on").wait_for()
        await page.get_by_text("No sessions yet").wait_for()
        await screens.shot("empty")

        async with chat_browser(gw) as customer:
            await say(customer, "Hi, is my bike ready?")
            item = page.locator(".session-item")
            await item.locator(".badge.working").wait_for()  # live, while the model works
            await screens.shot("working")
            await item.click()
            timeline = page.locator("#timeline")
            await timeline.get_by_text("Hi, is my bike ready?", exact=True).wait_for()
            await timeline.get_by_text("echo: Hi, is my bike ready?").wait_for()
            await page.locator(".run summary").first.click()
            run = page.locator(".run .body")
            await run.get_by_text("Model calls").wait_for()
            tool = run.locator(".tool[data-tool='search_knowledge']")
            assert "repairs" in await tool.locator("pre.args").inner_text()
            assert '"results"' in await tool.locator("pre.result").inner_text()

            await page.click("#btn-pause")
            await page.locator("#handoff-banner").get_by_text("taken over").wait_for()
            await item.locator(".badge.paused").first.wait_for()
            asked = len(fake_openai.requests)
            await say(customer, "Are you a real person?")
            await timeline.get_by_text("held for the operator").wait_for()
            await page.fill("#reply-text", "Yes! I'm Sam from the workshop. Your bike is ready.")
            await page.click("#reply-send")
            await page.locator(".row.operator").get_by_text("I'm Sam").wait_for()
            await until(
                lambda: _has(customer, "Yes! I'm Sam from the workshop. Your bike is ready."),
                "the operator's reply in the web chat",
            )
            assert len(fake_openai.requests) == asked  # the bot stayed quiet
            await screens.shot("takeover")

            await page.click("#btn-handback")
            await timeline.get_by_text("echo: Are you a real person?").wait_for()
            await page.locator("#btn-pause").wait_for()
            await screens.shot("handed-back")

            await say(customer, "Also, do you sell helmets?")
            await timeline.get_by_text("echo: Also, do you sell helmets?").wait_for()

        # the search reaches what customers wrote, not only what the list shows
        await page.fill("#filter", "HELMETS")
        await page.locator(".session-item").first.wait_for()
        await page.fill("#filter", "nobody wrote this")
        await page.get_by_text("No session matches.").wait_for()
        await page.fill("#filter", "")
        await page.locator(".session-item").first.wait_for()

        await page.click("#tab-usage")
        bars = page.locator("#chart rect.bar")
        await bars.first.wait_for()
        assert await bars.count() >= 1
        assert await page.locator("#by-channel tr[data-name='web']").count() == 1
        await screens.shot("usage")
        await page.click("#tab-dead")
        await page.get_by_text("Nothing failed").wait_for()
        await page.click("#logout")
        await page.locator("#login-form").wait_for()
        assert errors == []
        _keep(screens)


async def test_an_open_console_spaces_its_refreshes_and_skips_them_while_hidden(
    tmp_path: Path, fake_openai: FakeOpenAI, chromium: Any
) -> None:
    """Every change refetched the session list 120 ms later: with a big store (each fetch
    reads all history) one open tab kept a core busy."""
    fake_openai.responder = lambda body: Text(f"echo: {last_user_text(body)}")
    async with gateway(config(tmp_path, model_url=fake_openai.url)) as gw:
        page, errors = await _page(chromium)
        fetches: list[str] = []
        page.on(
            "request", lambda r: fetches.append(r.url) if "/admin/api/sessions?" in r.url else None
        )
        await page.goto(gw.url + "/admin")
        await page.fill("#token", TOKEN)
        await page.click("#login-submit")
        await page.locator("#live.on").wait_for()
        async with chat_browser(gw) as customer:
            await page.wait_for_timeout(1500)
            fetches.clear()
            for n in range(12):  # a change every quarter second, for three seconds
                await say(customer, f"message {n}")
                await page.wait_for_timeout(250)
            await page.locator(".session-item").first.wait_for()
            assert 1 <= len(fetches) <= 5, fetches
            await page.evaluate(
                "Object.defineProperty(document, 'hidden', {value: true, configurable: true})"
            )
            fetches.clear()
            await say(customer, "while hidden")
            await page.wait_for_timeout(2500)
            assert fetches == []
        assert errors == []


async def test_a_long_transcript_shows_earlier_messages_on_request(
    tmp_path: Path, chromium: Any
) -> None:
    """The console showed a session's newest 300 entries and nothing older, with no sign that
    anything was left out."""
    async with gateway(config(tmp_path, model_url=None)) as gw:
        key = SessionKey("default", "telegram", "default", "77")
        for i in range(320):
            msg = InboundMessage(
                channel="telegram",
                conversation="77",
                sender=Sender(id="77", name="Long Talker"),
                text=f"message number {i}",
                platform_id=str(i),
            )
            await gw.runtime.store.put_inbound(str(key), msg, 1000)
        page, errors = await _page(chromium)
        await page.goto(gw.url + "/admin#/sessions/" + str(key))
        await page.fill("#token", TOKEN)
        await page.click("#login-submit")
        timeline = page.locator("#timeline")
        await timeline.get_by_text("message number 319", exact=True).wait_for()
        assert await timeline.get_by_text("message number 5", exact=True).count() == 0
        await page.click("#earlier")
        await timeline.get_by_text("message number 0", exact=True).wait_for()
        assert await page.locator("#earlier").count() == 0
        assert errors == []


async def test_web_chat_streams_the_opening_hours(tmp_path: Path, chromium: Any) -> None:
    async with gateway(config(tmp_path, model_url=None, admin=False)) as gw:
        browser = await chromium.new_context()  # two tabs of it: one session (one cookie)
        page, errors = await _page(browser)
        screens = Screens(page, tmp_path / "screens")
        await page.goto(gw.url + "/")
        await page.locator("#status.on").wait_for()  # the event stream is open
        other_tab, other_errors = await _page(browser)
        await other_tab.goto(gw.url + "/")
        await other_tab.locator("#status.on").wait_for()
        await page.evaluate(
            """() => {
                window.__sizes = new Set();
                new MutationObserver(() => {
                  for (const b of document.querySelectorAll('.row.assistant .bubble'))
                    window.__sizes.add(b.textContent.length);
                }).observe(document.getElementById('log'),
                           {subtree: true, childList: true, characterData: true});
            }"""
        )
        await page.fill("#input", "what are your opening hours?")
        await page.press("#input", "Enter")
        answer = page.locator(".row.assistant:not(.pending) .bubble").filter(has_text="Monday")
        await answer.wait_for()
        assert await page.evaluate("window.__sizes.size") > 3  # it grew word by word
        assert "hours.md" in await answer.inner_text()
        await screens.shot("web-chat")
        for tab in (page, other_tab):  # the question once in each tab, then the answer
            question = tab.locator(".row.user").filter(has_text="opening hours")
            await question.wait_for()
            assert await question.count() == 1
            await tab.locator(".row.assistant:not(.pending)").filter(has_text="Monday").wait_for()
        assert errors + other_errors == []
        await browser.close()


async def test_web_chat_sends_a_choice_once_however_often_it_is_tapped(
    tmp_path: Path, fake_openai: FakeOpenAI, chromium: Any
) -> None:
    """The buttons stayed live after a tap: a double tap asked the agent twice."""
    yes_no = '{"buttons": [{"label": "Yes", "value": "y"}, {"label": "No", "value": "n"}]}'
    fake_openai.script(ToolCalls([("send_buttons", yes_no)]), Text("Shall I book it?"))
    fake_openai.responder = lambda body: Text(f"echo: {last_user_text(body)}", delay_s=0.5)
    async with gateway(config(tmp_path, model_url=fake_openai.url, admin=False)) as gw:
        page, errors = await _page(chromium)
        posts: list[str] = []
        page.on("request", lambda r: posts.append(r.url) if r.method == "POST" else None)
        await page.goto(gw.url + "/")
        await page.locator("#status.on").wait_for()
        await page.fill("#input", "book a table")
        await page.press("#input", "Enter")
        yes = page.locator(".chip").filter(has_text="Yes")
        await yes.wait_for()
        await yes.dblclick()
        await page.locator(".row.assistant").filter(has_text="pressed the button").wait_for()
        assert await page.locator(".row.user").count() == 2
        assert len(posts) == 2  # the question and one press
        assert await page.locator(".chip:disabled").count() == 2
    assert len(fake_openai.requests) == 3
    assert errors == []


def _self_signed(folder: Path, host: str) -> tuple[Path, Path]:
    """A throwaway certificate for `host` and its key, by the openssl command (the browser
    ignores HTTPS errors: only the scheme matters). A library for this (trustme) brought
    `cryptography` into the environment, which python-telegram-bot then imports for Telegram
    Passport: 7 MB more in every gateway the memory benchmark measured."""
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"),
            *("-nodes", "-days", "1", "-subj", f"/CN={host}"),
            *("-addext", f"subjectAltName=DNS:{host}", "-keyout", str(key), "-out", str(cert)),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


async def test_web_chat_works_framed_by_a_page_of_another_site(
    tmp_path: Path, chromium: Any
) -> None:
    """A shop on its own domain frames the chat served over HTTPS. Its SameSite=Lax cookie was
    never sent from the frame: each request was a new session, and no answer ever showed."""
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(*_self_signed(tmp_path, "localhost"))
    app = build_app(load_settings(config(tmp_path, model_url=None)))
    runner = web.AppRunner(app, shutdown_timeout=1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    shop = web.Application()
    frame = f'<iframe id="chat" src="https://localhost:{port}/" width="800" height="600">'

    async def shop_page(request: web.Request) -> web.Response:
        return web.Response(text=frame, content_type="text/html")

    shop.router.add_get("/", shop_page)
    shop_runner, shop_url = await serve(shop)  # http://127.0.0.1: another site
    browser = await chromium.new_context(ignore_https_errors=True)
    try:
        page, _ = await _page(browser)
        await page.goto(shop_url + "/")
        chat = page.frame_locator("#chat")
        await chat.locator("#status.on").wait_for()
        await chat.locator("#input").fill("what are your opening hours?")
        await chat.locator("#input").press("Enter")
        answer = chat.locator(".row.assistant:not(.pending)").filter(has_text="Monday")
        await answer.wait_for()
        [cookie] = await browser.cookies()
        assert (cookie["sameSite"], cookie["secure"]) == ("None", True)
    finally:
        await browser.close()
        await shop_runner.cleanup()
        await runner.cleanup()


async def test_web_chat_renders_hostile_markdown_as_text(tmp_path: Path, chromium: Any) -> None:
    """What the model writes is rendered by the page's own small Markdown renderer: markup in
    it stays text, links are http(s) only, and a code span never lands inside a URL."""
    cases = [
        "<img src=x onerror=alert(1)>",
        "[x](javascript:alert(1))",
        "<script>alert(1)</script>",
        '[a](https://x.example/"onmouseover="alert(1))',
        "[a](http://x`<b>y</b>`)",
        "```html\n<svg onload=alert(1)>\n```",
        "# <i>title</i>\n> <b>quote</b>\n- <u>item</u>",
    ]
    async with gateway(config(tmp_path, model_url=None, admin=False)) as gw:
        page, errors = await _page(chromium)
        await page.goto(gw.url + "/")
        rendered = await page.evaluate("cases => cases.map(md)", cases)
    for html in rendered:
        tags = set(re.findall(r"</?([a-z0-9]+)", html))
        assert tags <= {"a", "code", "pre", "h1", "blockquote", "ul", "li", "p", "br", "em"}, html
        hrefs = re.findall(r'href="([^"]*)"', html)
        assert all(h.startswith(("http://", "https://")) for h in hrefs), html
        assert not re.search(r'href="[^"]*(<|&lt;)code', html), html
    assert errors == []


def _console_error(message: Any, errors: list[str]) -> None:
    # a 401 before signing in is how the page learns it must show the login form
    if message.type == "error" and "status of 401" not in message.text:
        errors.append(message.text)


async def _has(client: Any, text: str) -> bool:
    return text in await replies(client)


def _keep(screens: Screens) -> None:
    """With SWITCHBOARD_KEEP_SCREENSHOTS=1, copy the last set next to the tests."""
    if os.environ.get("SWITCHBOARD_KEEP_SCREENSHOTS") != "1":
        return
    target = Path(__file__).parent / "artifacts"
    target.mkdir(exist_ok=True)
    for png in screens.folder.glob("*.png"):
        shutil.copy(png, target / png.name)


async def _ask_while_it_streams(page: Any, url: str, text: str, *, until: str) -> None:
    """Open the chat, send `text`, and wait until its answer has streamed as far as `until`."""
    await page.goto(url + "/")
    await page.locator("#status.on").wait_for()
    await page.fill("#input", text)
    await page.press("#input", "Enter")
    await page.locator(".row.assistant.pending").filter(has_text=until).wait_for()


async def test_web_chat_opened_mid_answer_shows_it_from_the_start_and_spent_buttons_stay_spent(
    tmp_path: Path, fake_openai: FakeOpenAI, chromium: Any
) -> None:
    """A tab opened (or reloaded) mid-answer showed only what streamed after it opened, a
    fragment, and no sign of work before that; after a reload the buttons already pressed
    were live again, and a press answered twice."""
    words = " ".join(f"w{i}" for i in range(30))
    yes_no = '{"buttons": [{"label": "Yes", "value": "y"}, {"label": "No", "value": "n"}]}'
    fake_openai.script(
        Text(words, chunk_delay_s=0.15), ToolCalls([("send_buttons", yes_no)]), Text("Book it?")
    )
    fake_openai.responder = lambda body: Text(f"echo: {last_user_text(body)}")
    async with gateway(config(tmp_path, model_url=fake_openai.url, admin=False)) as gw:
        context = await chromium.new_context()
        page, errors = await _page(context)
        await _ask_while_it_streams(page, gw.url, "tell me", until="w5")
        late, late_errors = await _page(context)  # a second tab, opened mid-answer
        await late.goto(gw.url + "/")
        preview = late.locator(".row.assistant.pending")
        await preview.filter(has_text="w8").wait_for()
        assert (await preview.inner_text()).startswith("w0 w1 w2")
        await late.locator(".row.assistant:not(.pending)").filter(has_text="w29").wait_for()
        await page.fill("#input", "book")
        await page.press("#input", "Enter")
        await page.locator(".chip").filter(has_text="Yes").click()
        await page.locator(".row.assistant").filter(has_text="pressed the button").wait_for()
        await page.reload()
        await page.locator(".row.assistant").filter(has_text="pressed the button").wait_for()
        assert await page.locator(".chip").count() == 2
        assert await page.locator(".chip:disabled").count() == 2
        assert errors + late_errors == []
        await context.close()


async def test_web_chat_started_over_mid_answer_shows_no_answer_to_the_old_conversation(
    tmp_path: Path, fake_openai: FakeOpenAI, chromium: Any
) -> None:
    """ "New conversation" while an answer streamed: the old answer, and a /reset bubble, came
    into the new conversation's page (and were gone after a reload)."""
    words = " ".join(f"w{i}" for i in range(20))
    fake_openai.script(Text(words, chunk_delay_s=0.1))
    async with gateway(config(tmp_path, model_url=fake_openai.url, admin=False)) as gw:
        page, errors = await _page(chromium)
        await _ask_while_it_streams(page, gw.url, "tell me", until="w3")
        await page.click("#reset")
        await page.locator(".row.assistant").filter(has_text="start").first.wait_for()
        await page.wait_for_timeout(500)
        texts = await page.locator(".row").all_inner_texts()
        assert not [t for t in texts if "w19" in t or "w3" in t or "/reset" in t], texts
        assert errors == []
