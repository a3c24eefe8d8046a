"""Several agents in one gateway: inheritance, drafts, bindings (most specific wins), tools."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio

from channels.web import conversation_of
from core.errors import ConfigError
from core.routing import Binding, Router
from gateway.agents_config import AgentOverride, AgentSettings
from gateway.app import build_app
from gateway.config_checks import settings_warnings
from gateway.settings import load_settings
from tests.fake_openai import FakeOpenAI
from tests.loopback import serve


def test_router_most_specific_binding_wins() -> None:
    router = Router(
        [
            Binding("support", channel="whatsapp"),
            Binding("vip", channel="whatsapp", conversation="155"),
            Binding("sales", channel="whatsapp", account="pn2"),
            Binding("late", channel="whatsapp"),
        ]
    )
    assert router.agent_for("whatsapp", "pn1", "155") == "vip"
    assert router.agent_for("whatsapp", "pn2", "156") == "sales"
    assert router.agent_for("whatsapp", "pn1", "156") == "support"  # first of equals
    assert router.agent_for("web", "default", "x") == "default"


def _write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "sb.toml"
    path.write_text(body)
    return path


def test_agents_inherit_from_agent_and_model(tmp_path: Path) -> None:
    s = load_settings(
        _write(
            tmp_path,
            '[agent]\nhistory_turns = 4\ntimezone = "Europe/Madrid"\n'
            '[agents.sales]\ninstructions = "Sell bikes."\nqueue_mode = "followup"\n'
            "[agents.sales.limits]\nmax_steps = 2\n"
            "[agents.later]\n",
        )
    )
    agents = s.resolved_agents()
    sales = agents["sales"]
    assert sales.settings.instructions == "Sell bikes."
    assert sales.settings.history_turns == 4
    assert sales.settings.timezone == "Europe/Madrid"
    assert sales.settings.queue_mode == "followup"
    assert sales.settings.limits.max_steps == 2
    assert sales.model == s.model
    assert not sales.draft
    assert agents["later"].draft
    assert ("agents.later", "draft (no instructions, or draft = true): not served") in (
        settings_warnings(s)
    )


def test_every_per_agent_key_of_agent_can_be_set_for_another_agent(tmp_path: Path) -> None:
    """The README says another agent takes what it does not set from [agent], key by key;
    workspace_dir and the skill limits were refused under [agents.NAME] as unknown keys."""
    own = {
        "workspace_dir": '"data/sales-ws"',
        "skill_timeout_s": "5.0",
        "skill_memory_mb": "128",
        "skill_max_output_bytes": "2048",
    }
    body = '[agents.sales]\ninstructions = "Sell."\n' + "".join(
        f"{k} = {v}\n" for k, v in own.items()
    )
    sales = load_settings(_write(tmp_path, body)).resolved_agents()["sales"].settings
    assert (sales.workspace_dir, sales.skill_timeout_s) == ("data/sales-ws", 5.0)
    assert (sales.skill_memory_mb, sales.skill_max_output_bytes) == (128, 2048)
    shared = AgentSettings.model_fields.keys() - {"max_concurrent_runs"}  # gateway-wide
    assert shared <= AgentOverride.model_fields.keys()


@pytest.mark.parametrize(
    ("body", "key"),
    [
        ('[[bindings]]\nagent = "ghost"\nchannel = "web"\n', "bindings[0].agent"),
        ('[agents.later]\n[[bindings]]\nagent = "later"\n', "bindings[0].agent"),
        ('[[bindings]]\nagent = "default"\nchannel = "fax"\n', "bindings[0].channel"),
        ('[agents.sales]\ninstructions = "x"\ntools = ["rm_rf"]\n', "agents.sales.tools"),
        ('[agent]\ntools = ["search_knowledge", "nope"]\n', "agent.tools"),
        ('[agents.Sales]\ninstructions = "x"\n', "agents.Sales"),
        ('[agents.default]\ninstructions = "x"\n', "agents.default"),
        ('[agents.x]\ninstructions = "x"\nknowledge_dir = "nowhere"\n', "agents.x.knowledge_dir"),
        (
            '[agents.x]\ninstructions = "x"\n[agents.x.model]\nprovider = "openai"\n',
            "agents.x.model.name",
        ),
        ('[model.fallback]\nprovider = "openai"\nbase_url = "http://h"\n', "model.fallback.name"),
        ('[model]\nprovider = "anthropic"\napi_key = "k"\n', "model.name"),
        ('[model]\nprovider = "anthropic"\nname = "claude"\n', "model.api_key"),
        ('[model]\nprovider = "scripted"\n', "model.script"),
        ('[model]\nprovider = "scripted"\nscript = "no/such.json"\n', "model.script"),
    ],
)
def test_agent_and_binding_problems_name_their_key(tmp_path: Path, body: str, key: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(_write(tmp_path, body))
    assert key in [k for k, _ in err.value.problems]


@pytest_asyncio.fixture
async def gateway(tmp_path: Path, fake_openai: FakeOpenAI) -> AsyncIterator[str]:
    config = _write(
        tmp_path,
        f'[store]\nurl = "sqlite:///{tmp_path}/db.sqlite"\n'
        f'[model]\nprovider = "openai"\nbase_url = "{fake_openai.url}"\nname = "fake"\n'
        '[agent]\ninstructions = "You are the front desk."\n'
        '[agents.vip]\ninstructions = "You are the VIP concierge."\ntools = ["current_time"]\n'
        '[[bindings]]\nagent = "vip"\nchannel = "web"\n'
        f'conversation = "{conversation_of("vip-customer-0001")}"\n',
    )
    runner, url = await serve(build_app(load_settings(config)))
    yield url
    await runner.cleanup()


async def test_bindings_route_conversations_to_agents_with_their_own_tools(
    gateway: str, fake_openai: FakeOpenAI
) -> None:
    async with httpx.AsyncClient(base_url=gateway, timeout=10) as client:
        for cookie, text in (("vip-customer-0001", "hello vip"), ("someone-else-0002", "hi")):
            r = await client.post(
                "/chat/messages",
                json={"text": text, "client_id": cookie},
                headers={"Cookie": f"switchboard_chat={cookie}"},
            )
            assert r.status_code == 202
        async with asyncio.timeout(10):
            while len(fake_openai.requests) < 2:
                await asyncio.sleep(0.05)
    by_text = {}
    for body in fake_openai.requests:
        system = body["messages"][0]["content"]
        by_text["vip" if "hello vip" in str(body["messages"]) else "other"] = (
            system,
            [t["function"]["name"] for t in body.get("tools", [])],
        )
    assert by_text["vip"][0].startswith("You are the VIP concierge.")
    assert by_text["vip"][1] == ["current_time", "read_result"]  # read_result: always
    assert by_text["other"][0].startswith("You are the front desk.")
    assert "search_knowledge" in by_text["other"][1]


def test_models_are_built_with_their_fallback(tmp_path: Path) -> None:
    from core.agent.fallback import FallbackModel
    from gateway.runtime import build_model
    from providers.anthropic import AnthropicClient

    s = load_settings(
        _write(
            tmp_path,
            '[model]\nprovider = "anthropic"\nname = "claude"\napi_key = "k"\ntimeout_s = 5\n'
            "max_retries = 1\n"
            '[model.fallback]\nprovider = "offline"\ncooldown_s = 5\n',
        )
    )
    model = build_model(s.model)
    assert isinstance(model, FallbackModel)
    assert isinstance(model._primary, AnthropicClient)
    assert settings_warnings(s) == []
    slow = load_settings(
        _write(tmp_path, '[model]\ntimeout_s = 60\n[model.fallback]\nprovider = "offline"\n')
    )
    assert "model.fallback" in [k for k, _ in settings_warnings(slow)]


def test_runtime_wires_knowledge_index_and_skills(tmp_path: Path) -> None:
    from gateway.runtime import Runtime

    s = load_settings(_write(tmp_path, f'[agent]\nknowledge_cache = "{tmp_path}/index.json"\n'))
    runtime = Runtime.build(s, {})
    profile = runtime.agents["default"]
    assert "rental-quote" in profile.instructions  # the skill's one-line summary
    names = [spec.name for spec in profile.loop._tools.specs()]
    assert {"load_skill", "run_skill_script", "read_knowledge"} <= set(names)
    assert (tmp_path / "index.json").is_file()  # the search index is stored


def test_an_agent_is_told_only_of_what_it_is_granted(tmp_path: Path) -> None:
    """Skills are named only to an agent that may run them; read_result comes with any grant,
    since a big result's card points to it."""
    from gateway.runtime import Runtime

    body = (
        f'[agent]\nknowledge_cache = "{tmp_path}/index.json"\n'
        '[agents.narrow]\ninstructions = "Be brief."\ntools = ["current_time"]\n'
        '[[bindings]]\nagent = "narrow"\nchannel = "web"\n'
    )
    profile = Runtime.build(load_settings(_write(tmp_path, body)), {}).agents["narrow"]
    assert "rental-quote" not in profile.instructions
    assert "load_skill" not in profile.instructions
    assert [spec.name for spec in profile.loop._tools.specs()] == ["current_time", "read_result"]


def test_a_broken_skill_is_a_config_error_naming_the_key(tmp_path: Path) -> None:
    skills = tmp_path / "skills" / "bad"
    skills.mkdir(parents=True)
    (skills / "SKILL.md").write_text("---\nname: Not A Valid Name\n---\n")
    with pytest.raises(ConfigError) as err:
        load_settings(_write(tmp_path, f'[agent]\nskills_dir = "{tmp_path}/skills"\n'))
    assert "agent.skills_dir" in [k for k, _ in err.value.problems]


def test_the_token_budget_warning_counts_what_the_agent_loop_sends(tmp_path: Path) -> None:
    """`check` estimates the system prompt and tool definitions every call repeats; they must
    be the served agent's own (its skills' summaries, its tools), and the allowance for a
    channel's output rules must cover the longest of them."""
    from channels.slack.adapter import OUTPUT_RULES as SLACK
    from channels.telegram.adapter import OUTPUT_RULES as TELEGRAM
    from channels.web.adapter import OUTPUT_RULES as WEB
    from channels.whatsapp.adapter import OUTPUT_RULES as WHATSAPP
    from core.agent.model import ChatMessage, estimate_messages, estimate_tools
    from core.agent.prompt import system_prompt
    from gateway.runtime import Runtime
    from gateway.tools import OUTPUT_RULES_TOKENS, standing_tokens

    s = load_settings(_write(tmp_path, f'[agent]\nknowledge_cache = "{tmp_path}/index.json"\n'))
    profile = Runtime.build(s, {}).agents["default"]
    bare = system_prompt(profile.instructions, "", {})
    served = estimate_tools(profile.loop._tools.specs()) + estimate_messages(
        [ChatMessage("system", bare)]
    )
    assert standing_tokens(s.agent, s.tools.http) == served + OUTPUT_RULES_TOKENS
    for rules in (SLACK, TELEGRAM, WEB, WHATSAPP):
        with_rules = estimate_messages([ChatMessage("system", system_prompt("x", rules, {}))])
        without = estimate_messages([ChatMessage("system", system_prompt("x", "", {}))])
        assert with_rules - without <= OUTPUT_RULES_TOKENS
