"""Configuration: one TOML file, ${VAR} interpolation, SWITCHBOARD__* overrides, problems by key,
and channels that fail closed."""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path
from typing import Any

import pytest

from core.errors import ConfigError
from core.sessions import QueueMode
from gateway.agents_config import DEFAULT_INSTRUCTIONS
from gateway.config_checks import secret_values, settings_warnings
from gateway.settings import EXAMPLE_CONFIG, Settings, load_settings
from gateway.tools import standing_tokens


def write(tmp_path: Path, text: str, name: str = "switchboard.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def problems_of(path: Path, environ: dict[str, str] | None = None) -> list[tuple[str, str]]:
    with pytest.raises(ConfigError) as info:
        load_settings(path, environ=environ)
    assert info.value.problems, "a ConfigError must carry at least one problem"
    return info.value.problems


def keys_of(path: Path) -> set[str]:
    return {key for key, _ in problems_of(path)}


# defaults and the shipped example


def test_defaults_when_the_file_sets_nothing(tmp_path: Path) -> None:
    s = load_settings(write(tmp_path, "# nothing here\n"))
    assert (s.server.host, s.server.port, s.server.public_url) == ("127.0.0.1", 8080, None)
    assert s.server.max_body_bytes == 1_048_576
    assert s.store.url == "sqlite:///data/switchboard.db"
    assert s.sqlite_path() == "data/switchboard.db"
    assert s.model.provider == "offline"
    assert s.model.api_key is None
    a = s.agent
    assert a.instructions == DEFAULT_INSTRUCTIONS
    assert a.knowledge_dir == "config/knowledge"
    assert a.queue_mode is QueueMode.COLLECT
    assert (a.history_turns, a.debounce_ms, a.max_concurrent_runs) == (10, 0, 8)
    lim = a.limits
    assert (lim.max_steps, lim.max_tool_calls, lim.max_output_tokens) == (5, 6, 350)
    assert (lim.token_budget, lim.run_timeout_s, lim.temperature) == (7000, 45.0, 0.2)
    ch = s.channels
    assert ch.web.enabled
    assert [ch.telegram.enabled, ch.slack.enabled, ch.whatsapp.enabled] == [False] * 3
    assert ch.telegram.api_base == "https://api.telegram.org"
    assert ch.slack.api_base == "https://slack.com/api"
    assert ch.slack.mode == "events"
    assert (ch.whatsapp.api_base, ch.whatsapp.api_version) == (
        "https://graph.facebook.com",
        "v21.0",
    )
    assert s.channels.telegram.effective_mode(s.server.public_url) == "polling"  # no public_url
    assert settings_warnings(s) == []


def test_the_shipped_example_loads_clean() -> None:
    s = load_settings(EXAMPLE_CONFIG)
    assert isinstance(s, Settings)
    assert "Harbor Lane Bikes" in s.agent.instructions
    assert s.model.provider == "offline"
    assert s.channels.web.enabled
    assert settings_warnings(s) == []


def test_the_shipped_example_shows_each_key_it_sets_with_its_default() -> None:
    """The README says it holds every key with its default: it set agent.timezone to
    "America/New_York", whose default is "UTC". An example value is a comment, except the
    demo shop's instructions."""
    example = tomllib.loads(EXAMPLE_CONFIG.read_text(encoding="utf-8"))

    def differing(data: dict[str, Any], model: Any, key: str) -> list[tuple[str, Any, Any]]:
        out = []
        for name, value in data.items():
            default = getattr(model, name)
            if isinstance(value, dict):
                out += differing(value, default, f"{key}{name}.")
            elif value != default:
                out.append((f"{key}{name}", value, default))
        return out

    found = differing(example, Settings(), "")
    assert [key for key, _, _ in found] == ["agent.instructions"], found


def test_values_from_the_file_are_used(tmp_path: Path) -> None:
    s = load_settings(
        write(
            tmp_path,
            '[server]\nhost = "0.0.0.0"\nport = 9000\npublic_url = "https://bot.example.com"\n'
            '[agent]\nqueue_mode = "followup"\nhistory_turns = 4\n'
            "[agent.limits]\nmax_steps = 7\ntemperature = 0.0\n",
        )
    )
    assert (s.server.host, s.server.port) == ("0.0.0.0", 9000)
    assert s.server.public_url == "https://bot.example.com"
    assert s.agent.queue_mode is QueueMode.FOLLOWUP
    assert s.agent.history_turns == 4
    assert (s.agent.limits.max_steps, s.agent.limits.temperature) == (7, 0.0)
    assert s.agent.limits.max_tool_calls == 6  # untouched keys keep their defaults
    assert s.channels.telegram.effective_mode(s.server.public_url) == "webhook"  # public_url set


# ${VAR} interpolation


def test_interpolation_reads_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SB_TEST_HOST", "bot.example.com")
    monkeypatch.setenv("SB_TEST_TOKEN", "123:abc")
    s = load_settings(
        write(
            tmp_path,
            '[server]\npublic_url = "https://${SB_TEST_HOST}/hook"\n'
            '[channels.telegram]\nenabled = true\nmode = "polling"\ntoken = "${SB_TEST_TOKEN}"\n',
        )
    )
    assert s.server.public_url == "https://bot.example.com/hook"
    assert s.channels.telegram.token is not None
    assert s.channels.telegram.token.get_secret_value() == "123:abc"


def test_interpolation_default_when_unset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SB_TEST_UNSET", raising=False)
    monkeypatch.setenv("SB_TEST_NAME", "gpt-test")
    s = load_settings(
        write(
            tmp_path,
            '[server]\nhost = "${SB_TEST_UNSET:-10.0.0.1}"\nport = "${SB_TEST_UNSET:-8123}"\n'
            '[model]\nname = "${SB_TEST_NAME:-fallback}"\n'
            'base_url = "http://h${SB_TEST_UNSET:-X}/v1"\n',
        )
    )
    assert s.server.host == "10.0.0.1"
    assert s.server.port == 8123  # interpolated text is still validated as an int
    assert s.model.name == "gpt-test"
    assert s.model.base_url == "http://hX/v1"


def test_interpolation_default_applies_when_set_but_empty(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SB_TEST_EMPTY", "")
    s = load_settings(write(tmp_path, '[server]\nhost = "${SB_TEST_EMPTY:-10.0.0.2}"\n'))
    assert s.server.host == "10.0.0.2"


def test_missing_variable_is_a_problem_naming_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SB_TEST_MISSING_TOKEN", raising=False)
    problems = problems_of(
        write(
            tmp_path,
            '[channels.telegram]\nenabled = true\nmode = "polling"\n'
            'token = "${SB_TEST_MISSING_TOKEN}"\n',
        )
    )
    assert [key for key, _ in problems] == ["channels.telegram.token"]
    assert "SB_TEST_MISSING_TOKEN" in problems[0][1]


@pytest.mark.parametrize(
    "written",
    [
        *("${SB_SECRET", "${}", "${SB SECRET}", "${1SECRET}", "${X-dflt}", "${X:?required}"),
        "${SB_UNSET_SECRET:-${SB_OTHER}}",  # was the text "${SB_OTHER}"
    ],
)
def test_a_malformed_reference_is_a_problem_not_the_secret_itself(
    tmp_path: Path, written: str
) -> None:
    """Kept as text, "${SLACK_SIGNING_SECRET" (a brace missing) became the signing secret,
    and anyone who guessed the typo could sign requests."""
    problems = problems_of(
        write(
            tmp_path,
            '[channels.slack]\nenabled = true\nbot_token = "xoxb-1"\n'
            f'signing_secret = "{written}"\n',
        )
    )
    assert [key for key, _ in problems] == ["channels.slack.signing_secret"]
    assert "${NAME}" in problems[0][1]


def test_a_literal_dollar_brace_is_written_doubled(tmp_path: Path) -> None:
    s = load_settings(write(tmp_path, '[agent]\ninstructions = "Prices look like $${amount}."\n'))
    assert s.agent.instructions == "Prices look like ${amount}."


def test_a_missing_variable_does_not_hide_the_other_problems(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SB_TEST_UNSET_ABC", raising=False)
    problems = problems_of(
        write(
            tmp_path,
            '[server]\nport = 8000\nbogus = 1\n[model]\napi_key = "${SB_TEST_UNSET_ABC}"\n'
            '[agent.limits]\nmax_steps = "x"\n',
        )
    )
    assert [key for key, _ in problems] == [
        "model.api_key",
        "server.bogus",
        "agent.limits.max_steps",
    ]
    assert "SB_TEST_UNSET_ABC" in problems[0][1]


def test_a_missing_variable_is_reported_once_at_its_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its empty stand-in is not reported again (as not an integer, or a missing secret)."""
    monkeypatch.delenv("SB_TEST_UNSET_PORT", raising=False)
    monkeypatch.delenv("SB_TEST_UNSET_SECRET", raising=False)
    problems = problems_of(
        write(
            tmp_path,
            '[server]\nport = "${SB_TEST_UNSET_PORT}"\n'
            '[channels.slack]\nenabled = true\nbot_token = "xoxb-1"\n'
            'signing_secret = "${SB_TEST_UNSET_SECRET}"\nallow_from = ["${SB_TEST_UNSET_PORT}"]\n',
        )
    )
    assert [key for key, _ in problems] == [
        "server.port",
        "channels.slack.signing_secret",
        "channels.slack.allow_from[0]",
    ]
    assert all("is not set" in msg for _, msg in problems)


# SWITCHBOARD__* overrides


def test_environment_overrides_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(
        tmp_path, "[server]\nport = 8000\n[agent.limits]\nmax_steps = 5\nmax_tool_calls = 2\n"
    )
    monkeypatch.setenv("SWITCHBOARD__SERVER__PORT", "9001")
    monkeypatch.setenv("SWITCHBOARD__AGENT__LIMITS__MAX_STEPS", "3")
    s = load_settings(path)
    assert s.server.port == 9001
    assert s.agent.limits.max_steps == 3
    assert s.agent.limits.max_tool_calls == 2  # the rest of the section still comes from the file
    assert s.server.host == "127.0.0.1"


def test_a_variable_reaches_a_table_whose_name_has_capitals(tmp_path: Path) -> None:
    """A variable's name has one case: it made a new table `orderstatus`, and the file's
    `[tools.http.OrderStatus]` lost its description."""
    path = write(
        tmp_path,
        '[tools.http.OrderStatus]\ndescription = "Look up an order."\n'
        'url = "https://shop.example.com/orders"\n',
    )
    s = load_settings(path, environ={"SWITCHBOARD__TOOLS__HTTP__ORDERSTATUS__TIMEOUT_S": "5"})
    assert list(s.tools.http) == ["OrderStatus"]
    assert s.tools.http["OrderStatus"].timeout_s == 5


def test_a_secret_read_from_a_file_loses_its_line_break(tmp_path: Path) -> None:
    """A secret mounted from a file ends in a newline: sent in a header it failed every call
    (and `check` with a traceback). One inside a secret is a problem by its key."""
    path = write(tmp_path, '[admin]\ntoken = "${ADMIN}"\n[model]\napi_key = "${KEY}"\n')
    s = load_settings(path, environ={"ADMIN": "0123456789abcdef-admin\n", "KEY": " sk-1\r\n"})
    assert s.admin.token is not None
    assert s.admin.token.get_secret_value() == "0123456789abcdef-admin"
    assert s.model.api_key is not None
    assert s.model.api_key.get_secret_value() == "sk-1"
    problems = problems_of(path, environ={"ADMIN": "0123456789\nabcdef", "KEY": "sk\u200b1"})
    assert {k for k, _ in problems} == {"admin.token", "model.api_key"}
    assert all("control or invisible character" in m for _, m in problems)


@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("{tmp}", "is a folder"),
        ("{tmp}/sb.db?mode=ro", "no ?parameters"),
        ("{tmp}/a\u0000b.db", "a NUL character"),
        ("{tmp}/file.txt/sb.db", "is a file, not a folder"),
        ("/proc/sb.db", "is not writable"),  # root may write anywhere, says access(2)
    ],
)
def test_a_sqlite_file_the_store_cannot_open_is_a_problem_by_key(
    tmp_path: Path, path: str, says: str
) -> None:
    (tmp_path / "file.txt").write_text("x")
    url = "sqlite:///" + path.format(tmp=tmp_path)
    problems = problems_of(write(tmp_path, f"[store]\nurl = {json.dumps(url)}\n"))
    assert [k for k, m in problems if says in m] == ["store.url"]


def test_an_overrides_variable_is_read_too(tmp_path: Path) -> None:
    """Taken as text, SWITCHBOARD__ADMIN__TOKEN='${ADMIN_TOKEN}' made "${ADMIN_TOKEN}" the
    admin token (a service manager that does not expand variables leaves them so)."""
    path = write(tmp_path, "")
    env = {"SWITCHBOARD__ADMIN__TOKEN": "${ADMIN_TOKEN}", "ADMIN_TOKEN": "0123456789abcdef-x"}
    token = load_settings(path, environ=env).admin.token
    assert token is not None
    assert token.get_secret_value() == "0123456789abcdef-x"
    problems = problems_of(path, environ={"SWITCHBOARD__ADMIN__TOKEN": "${ADMIN_TOKEN}"})
    reason = "environment variable ADMIN_TOKEN is not set (from SWITCHBOARD__ADMIN__TOKEN)"
    assert problems == [("admin.token", reason)]  # the file has no such ${VAR}: say where
    literal = {"SWITCHBOARD__AGENT__INSTRUCTIONS": "Say $${name}."}
    assert load_settings(path, environ=literal).agent.instructions == "Say ${name}."


def test_the_file_may_start_with_a_byte_order_mark_and_must_be_a_file(tmp_path: Path) -> None:
    path = tmp_path / "bom.toml"
    path.write_bytes(b"\xef\xbb\xbf[server]\nport = 8123\n")
    assert load_settings(path, environ={}).server.port == 8123
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)  # reading it waited for a writer forever
    assert problems_of(fifo) == [("config", f"{fifo} is not a regular file")]
    link = tmp_path / "link.toml"
    link.symlink_to(tmp_path / "gone.toml")
    assert "which does not exist" in problems_of(link)[0][1]


def test_an_empty_knowledge_dir_is_refused_not_the_working_directory(tmp_path: Path) -> None:
    problems = problems_of(write(tmp_path, '[agent]\nknowledge_dir = ""\n'))
    assert ("agent.knowledge_dir", "empty: name the folder of the knowledge base") in problems


def test_a_skills_dir_that_is_set_must_exist_as_a_knowledge_dir_must(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A misspelt skills_dir left the agent without its skills, and check said nothing. Only
    the default may be absent: an agent needs no skills."""
    body = '[agent]\nskills_dir = "no/such"\n[agents.x]\ninstructions = "x"\nskills_dir = ""\n'
    body += '[agents.y]\ninstructions = "y"\n'  # takes [agent]'s: reported there, once
    problems = [p for p in problems_of(write(tmp_path, body)) if "skills_dir" in p[0]]
    assert problems == [
        ("agent.skills_dir", "not a directory: no/such"),
        ("agents.x.skills_dir", "empty: name the folder of the skills (or leave it unset)"),
    ]
    kb = Path("config/knowledge").resolve()
    monkeypatch.chdir(tmp_path)  # no config/skills here
    s = load_settings(write(tmp_path, f'[agent]\nknowledge_dir = "{kb}"\n'))
    assert not Path(s.agent.skills_dir).exists()


def test_environ_argument_is_the_environment_for_overrides(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(tmp_path, "[server]\nport = 8000\n")
    monkeypatch.setenv("SWITCHBOARD__SERVER__PORT", "9002")
    assert load_settings(path, environ={}).server.port == 8000
    assert load_settings(path, environ={"SWITCHBOARD__SERVER__PORT": "9001"}).server.port == 9001


def test_environment_override_is_validated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWITCHBOARD__AGENT__LIMITS__MAX_STEPS", "0")
    assert keys_of(write(tmp_path, "")) == {"agent.limits.max_steps"}


def test_environment_can_enable_a_channel_and_it_fails_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SWITCHBOARD__CHANNELS__SLACK__ENABLED", "true")
    assert keys_of(write(tmp_path, "")) == {
        "channels.slack.bot_token",
        "channels.slack.signing_secret",
    }


@pytest.mark.parametrize("value", ["U1,U2", " U1 , U2 ,", '["U1", "U2"]'])
@pytest.mark.parametrize(
    "key",
    [
        "channels.slack.allow_from",
        "channels.web.allow_from",
        "channels.web.block_from",
        "channels.whatsapp.phone_number_ids",
    ],
)
def test_a_list_key_takes_a_json_array_or_commas_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, key: str, value: str
) -> None:
    monkeypatch.setenv("SWITCHBOARD__" + key.replace(".", "__").upper(), value)
    s = load_settings(write(tmp_path, ""))
    section, name = key.rsplit(".", 1)
    node: object = s
    for part in section.split("."):
        node = getattr(node, part)
    assert getattr(node, name) == ["U1", "U2"]


def test_list_keys_from_the_environment_beyond_the_channels(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SWITCHBOARD__AGENT__TOOLS", "search_knowledge")  # list[str] | None
    monkeypatch.setenv("SWITCHBOARD__AGENTS__SALES__TOOLS", "[]")  # inside a [agents.NAME] table
    monkeypatch.setenv("SWITCHBOARD__AGENTS__SALES__INSTRUCTIONS", "Sell bikes.")
    monkeypatch.setenv("SWITCHBOARD__BINDINGS", '[{"agent": "sales", "channel": "web"}]')
    s = load_settings(write(tmp_path, ""))
    assert s.agent.tools == ["search_knowledge"]
    assert s.agents["sales"].tools == []
    assert [(b.agent, b.channel) for b in s.bindings] == [("sales", "web")]


ORDER_TOOL = (
    '[tools.http.order_status]\ndescription = "Look up an order."\n'
    'url = "https://shop.example.com/api/orders/{order_id}"\n'
    'parameters = { type = "object", properties = { order_id = { type = "string" } } }\n'
)


def test_a_table_key_takes_a_json_object_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An HTTP tool's headers (its secret token) could not come from the environment as a
    JSON object: the variable's key was read as one header's value."""
    monkeypatch.setenv(
        "SWITCHBOARD__TOOLS__HTTP__ORDER_STATUS__HEADERS", '{"Authorization": "Bearer s3cret"}'
    )
    monkeypatch.setenv(
        "SWITCHBOARD__TOOLS__HTTP__STOCK",
        '{"description": "Stock of a product.", "url": "https://shop.example.com/stock"}',
    )
    monkeypatch.setenv("SWITCHBOARD__AGENT__LIMITS", '{"max_steps": 3}')
    s = load_settings(write(tmp_path, ORDER_TOOL))
    assert s.tools.http["order_status"].headers == {"Authorization": "Bearer s3cret"}
    assert s.tools.http["stock"].url == "https://shop.example.com/stock"
    assert s.agent.limits.max_steps == 3
    assert "Bearer s3cret" in secret_values(s)  # scrubbed from logs


@pytest.mark.parametrize("table_first", [True, False])
def test_a_keys_own_variable_beats_its_tables_whatever_their_order(
    tmp_path: Path, table_first: bool
) -> None:
    """The environment's order is arbitrary (Docker, systemd): the table's JSON object, read
    after the key's own variable, dropped it silently."""
    table = ("SWITCHBOARD__AGENT__LIMITS", '{"max_steps": 3, "max_tool_calls": 9}')
    key = ("SWITCHBOARD__AGENT__LIMITS__MAX_TOOL_CALLS", "2")
    environ = dict([table, key] if table_first else [key, table])
    s = load_settings(write(tmp_path, ""), environ=environ)
    assert (s.agent.limits.max_steps, s.agent.limits.max_tool_calls) == (3, 2)


def test_a_bad_json_object_from_the_environment_names_the_key_and_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SWITCHBOARD__TOOLS__HTTP__ORDER_STATUS__HEADERS", '{"Authorization": ')
    ((got, msg),) = problems_of(write(tmp_path, ORDER_TOOL))
    assert got == "tools.http.order_status.headers"
    assert msg.endswith("(from SWITCHBOARD__TOOLS__HTTP__ORDER_STATUS__HEADERS)")


@pytest.mark.parametrize(
    ("value", "key"),
    [
        ('["U1", 2]', "channels.slack.allow_from[1]"),
        ('["U1"', "channels.slack.allow_from"),
    ],
)
def test_a_bad_list_from_the_environment_names_the_key_and_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str, key: str
) -> None:
    monkeypatch.setenv("SWITCHBOARD__CHANNELS__SLACK__ALLOW_FROM", value)
    ((got, msg),) = problems_of(write(tmp_path, ""))
    assert got == key
    assert msg.endswith("(from SWITCHBOARD__CHANNELS__SLACK__ALLOW_FROM)")


def test_a_list_of_objects_takes_only_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWITCHBOARD__BINDINGS", "sales,web")
    assert keys_of(write(tmp_path, "")) == {"bindings"}


def test_an_unknown_section_from_the_environment_names_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SWITCHBOARD__BOGUS__X", "1")
    monkeypatch.setenv("SWITCHBOARD__SERVER__PROT", "1")
    assert sorted(problems_of(write(tmp_path, ""))) == [
        ("bogus", "unknown key (from SWITCHBOARD__BOGUS__X)"),
        ("server.prot", "unknown key (from SWITCHBOARD__SERVER__PROT)"),
    ]


def test_a_variable_under_a_key_that_takes_no_table_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SWITCHBOARD__SERVER__PORT__X makes server.port a table: the problem is the port's,
    and the variable is named (the file's port is fine)."""
    monkeypatch.setenv("SWITCHBOARD__SERVER__PORT__X", "1")
    ((key, msg),) = problems_of(write(tmp_path, "[server]\nport = 8080\n"))
    assert key == "server.port"
    assert msg.endswith("(from SWITCHBOARD__SERVER__PORT__X)")


def test_what_a_variable_made_required_names_the_variable(tmp_path: Path) -> None:
    """A tool only SWITCHBOARD__…__HEADERS made lacks its description, and a channel a
    variable enabled lacks its token: both were reported with no variable named, although
    the file had no such tool and the channel off."""
    env = {
        "SWITCHBOARD__TOOLS__HTTP__ORDER_STATUS__HEADERS": '{"Authorization": "Bearer x"}',
        "SWITCHBOARD__CHANNELS__SLACK__ENABLED": "true",
        "SWITCHBOARD__CHANNELS__SLACK__MODE": "socket",
    }
    body = '[tools.http.lookup]\nurl = "https://api.example.com/x"\n'
    body += "[channels.slack]\nenabled = false\n"
    problems = dict(problems_of(write(tmp_path, body), environ=env))
    tool = "(from SWITCHBOARD__TOOLS__HTTP__ORDER_STATUS__HEADERS)"
    assert problems["tools.http.order_status.description"] == f"Field required {tool}"
    assert problems["tools.http.lookup.description"] == "Field required"  # the file's tool
    enabled = "SWITCHBOARD__CHANNELS__SLACK__ENABLED"
    assert problems["channels.slack.bot_token"].endswith(f"enabled (from {enabled})")
    mode = "SWITCHBOARD__CHANNELS__SLACK__MODE"
    assert problems["channels.slack.app_token"].endswith(f"(from {enabled}, {mode})")


# server.host, checked without the network


@pytest.mark.parametrize(
    "host", ["0.0.0.0", "::", "::1", "127.0.0.1", "localhost", "gateway.internal", "my_app", "h."]
)
def test_server_host_accepts_addresses_and_host_names(tmp_path: Path, host: str) -> None:
    assert load_settings(write(tmp_path, f'[server]\nhost = "{host}"\n')).server.host == host


@pytest.mark.parametrize(
    "host", ["999.1.1.1", "1.2.3", "", "bad host", "-x.example", "[::1]", "a..b", "x" * 64]
)
def test_server_host_that_can_never_be_bound_names_the_key(tmp_path: Path, host: str) -> None:
    ((key, msg),) = problems_of(write(tmp_path, f'[server]\nhost = "{host}"\n'))
    assert key == "server.host"
    assert msg


def test_server_host_from_the_environment_is_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SWITCHBOARD__SERVER__HOST", "999.1.1.1")
    assert problems_of(write(tmp_path, "")) == [
        (
            "server.host",
            "'999.1.1.1' is not an IP address or a host name (from SWITCHBOARD__SERVER__HOST)",
        )
    ]


# problems by key


@pytest.mark.parametrize(
    ("toml", "key"),
    [
        ("[server]\nprot = 8080\n", "server.prot"),
        ("[agent.limits]\nmax_step = 3\n", "agent.limits.max_step"),
        ("[bogus]\nx = 1\n", "bogus"),
        ("[channels.telegram]\ntokn = 'x'\n", "channels.telegram.tokn"),
    ],
)
def test_unknown_key_is_reported_at_its_dotted_path(tmp_path: Path, toml: str, key: str) -> None:
    assert problems_of(write(tmp_path, toml)) == [(key, "unknown key")]


@pytest.mark.parametrize(
    "value", ['"many"', "0", "51", "1.5", "-3"], ids=["text", "zero", "too-big", "float", "neg"]
)
def test_bad_max_steps_names_the_key(tmp_path: Path, value: str) -> None:
    problems = problems_of(write(tmp_path, f"[agent.limits]\nmax_steps = {value}\n"))
    assert [key for key, _ in problems] == ["agent.limits.max_steps"]
    assert problems[0][1]  # a message, not just a key


@pytest.mark.parametrize(
    ("toml", "key"),
    [
        ("[server]\nport = 70000\n", "server.port"),
        ("[server]\nmax_body_bytes = 10\n", "server.max_body_bytes"),
        ("[agent.limits]\ntemperature = 3\n", "agent.limits.temperature"),
        ('[model]\nprovider = "bard"\n', "model.provider"),
        ("[model]\ntimeout_s = 0\n", "model.timeout_s"),
        ('[channels.web]\nenabled = "perhaps"\n', "channels.web.enabled"),
        ('[channels.telegram]\nmode = "carrier-pigeon"\n', "channels.telegram.mode"),
        ('[agent]\nknowledge_dir = "no/such/dir"\n', "agent.knowledge_dir"),
        ('[model]\nbase_url = "ftp://x"\n', "model.base_url"),
        ('[model]\nprovider = "openai"\napi_key = "k"\n', "model.name"),
        ('[server]\npublic_url = "bot.example.com"\n', "server.public_url"),
    ],
)
def test_invalid_values_name_their_key(tmp_path: Path, toml: str, key: str) -> None:
    assert keys_of(write(tmp_path, toml)) == {key}


@pytest.mark.parametrize(
    ("toml", "key", "message"),
    [
        ("[channels.telegram]\nenabled = 1\n", "channels.telegram.enabled", "true or false, not 1"),
        ('[server]\ntrust_forwarded = "yes"\n', "server.trust_forwarded", 'not "yes"'),
        ('[channels.web]\nenabled = "off"\n', "channels.web.enabled", 'not "off"'),
        ('[model]\nstream = "on"\n', "model.stream", 'not "on"'),
        ('[agent.limits]\ntoken_budget = "7000"\n', "agent.limits.token_budget", "whole number"),
        ("[store]\npool_size = 2.0\n", "store.pool_size", "a whole number, not 2.0"),
        ('[agents.x]\nhistory_turns = "3"\n', "agents.x.history_turns", 'not "3"'),
        (
            '[tools.http.t]\ndescription = "d"\nurl = "https://a.example.com/"\ntimeout_s = "5"\n',
            "tools.http.t.timeout_s",
            "a number",
        ),
        (  # JSON has no dates: counting the tool's tokens failed with a traceback
            '[tools.http.t]\ndescription = "d"\nurl = "https://a.example.com/"\n'
            'parameters = { type = "object", default = 2024-01-01 }\n',
            "tools.http.t.parameters",
            "a date or a time",
        ),
    ],
)
def test_a_value_of_the_wrong_type_in_the_file_is_refused_by_its_key(
    tmp_path: Path, toml: str, key: str, message: str
) -> None:
    """Lax validation took them: `enabled = 1` enabled the channel (and asked for its token),
    the text "7000" was a number. TOML has a type for each; the file must use it."""
    problems = problems_of(write(tmp_path, toml))
    assert [k for k, _ in problems] == [key]
    assert message in problems[0][1]


def test_text_from_the_environment_is_still_read_as_the_keys_type(tmp_path: Path) -> None:
    """${VAR} and SWITCHBOARD__ values are text by nature: they are parsed, not refused."""
    body = '[server]\nport = "${PORT}"\n[channels.web]\nenabled = "${WEB_ON:-true}"\n'
    env = {"PORT": "8123", "SWITCHBOARD__MODEL__STREAM": "off"}
    env["SWITCHBOARD__STORE__POOL_SIZE"] = "3"
    s = load_settings(write(tmp_path, body), environ=env)
    assert (s.server.port, s.channels.web.enabled, s.model.stream) == (8123, True, False)
    assert s.store.pool_size == 3


def test_every_problem_is_reported_not_just_the_first(tmp_path: Path) -> None:
    keys = keys_of(
        write(
            tmp_path,
            "[server]\nprot = 1\nport = -1\n[agent]\nqueue_mode = 'lifo'\n"
            "[agent.limits]\nmax_steps = 0\n",
        )
    )
    assert keys == {"server.prot", "server.port", "agent.queue_mode", "agent.limits.max_steps"}


def test_a_field_problem_does_not_hide_the_problems_across_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rules across keys ran only once every field was valid: check named server.port, and
    store.url (or a channel enabled without its token) only on the next attempt."""
    monkeypatch.setenv("SWITCHBOARD__AGENT__HISTORY_TURNS", "many")
    problems = dict(
        problems_of(
            write(
                tmp_path,
                '[server]\nport = "abc"\n[store]\nurl = "mysql://x"\n'
                "[channels.telegram]\nenabled = true\n",
            )
        )
    )
    assert set(problems) >= {
        "server.port",
        "agent.history_turns",
        "store.url",
        "channels.telegram.token",
    }
    assert "SWITCHBOARD__AGENT__HISTORY_TURNS" in problems["agent.history_turns"]


def test_a_required_key_that_fails_does_not_hide_its_sections_other_rules(
    tmp_path: Path,
) -> None:
    """An unset ${TELEGRAM_BOT_TOKEN} was reported alone; the missing webhook secret only once
    the token was set."""
    body = (
        '[server]\npublic_url = "https://bot.example.com"\n'
        '[channels.telegram]\nenabled = true\ntoken = "${TELEGRAM_BOT_TOKEN}"\n'
    )
    keys = [k for k, _ in problems_of(write(tmp_path, body), environ={})]
    assert keys == ["channels.telegram.token", "channels.telegram.webhook_secret"]


def test_a_stand_in_never_brings_back_a_section_set_aside(tmp_path: Path) -> None:
    """An HTTP tool URL from an unset variable: the tool set aside came back with the stand-in
    URL and no description, the check never settled, and every other problem was lost."""
    body = '[model]\nprovider = "openai"\n[tools.http.lookup]\ndescription = "x"\n'
    body += 'url = "${API}/x"\n'
    keys = {k for k, _ in problems_of(write(tmp_path, body), environ={})}
    assert {"tools.http.lookup.url", "model.name", "model.api_key"} <= keys


def test_a_problem_that_only_mentions_a_name_set_aside_is_still_reported(tmp_path: Path) -> None:
    body = '[agent]\nknowledge_dir = "docs/kb"\n[agents.docs]\nqueue_mode = "nope"\n'
    keys = {k for k, _ in problems_of(write(tmp_path, body))}
    assert {"agents.docs.queue_mode", "agent.knowledge_dir"} <= keys


TOOL = '[tools.http.order]\ndescription = "x"\nurl = "https://shop.example.com/o'


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            TOOL + '"\ntimeout_s = -1\nmethod = "PATCH"\n',
            {
                "tools.http.order.timeout_s": "greater than 0",
                "tools.http.order": "a PATCH tool changes things",
            },
        ),
        (
            TOOL + '/{nope}"\ntimeout_s = -1\n'
            'parameters = { type = "object", properties = { id = { type = "string" } } }\n',
            {
                "tools.http.order.timeout_s": "greater than 0",
                "tools.http.order": "{nope} is not one of parameters.properties",
            },
        ),
        (
            '[[bindings]]\nagent = "ghost"\nchannel = "fax"\nextra = 1\n',
            {
                "bindings[0].extra": "unknown key",
                "bindings[0].agent": "no agent named 'ghost'",
                "bindings[0].channel": "unknown channel 'fax'",
            },
        ),
    ],
)
def test_every_problem_of_a_tool_or_a_binding_is_reported_at_once(
    tmp_path: Path, body: str, expected: dict[str, str]
) -> None:
    """A tool's own rules (a write method, its URL's placeholders) run once its keys are valid,
    and a binding with one unknown key was set aside whole: check named one problem per
    attempt. A list item's key is spelt bindings[0].extra, as everywhere (was bindings.0.extra)."""
    problems = dict(problems_of(write(tmp_path, body)))
    assert set(problems) == set(expected)
    for key, part in expected.items():
        assert part in problems[key], key


def test_only_the_store_is_read_for_pairing_variables_included(tmp_path: Path) -> None:
    body = '[store]\nurl = "postgresql://sb:${PGPW}@127.0.0.1/sb"\n'
    body += '[channels.telegram]\nenabled = true\ntoken = "${TG_TOKEN}"\n'
    env = {"PGPW": "pw", "SWITCHBOARD__SERVER__PORT": "nope"}
    s = load_settings(write(tmp_path, body), environ=env, only=("store",))
    assert s.store.url == "postgresql://sb:pw@127.0.0.1/sb"


@pytest.mark.parametrize(
    ("body", "real", "made_up"),
    [
        (
            '[agent]\ntools = ["search_knowledge", "lookup"]\n[tools.http.lookup]\n'
            'url = "https://api.example.com:0/x"\ndescription = "d"\n',
            "tools.http.lookup.url",
            "agent.tools",
        ),
        (
            '[agents.sales]\nqueue_mode = "bogus"\n[[bindings]]\nagent = "sales"\n'
            'channel = "web"\n',
            "agents.sales.queue_mode",
            "bindings[0].agent",
        ),
    ],
)
def test_a_key_set_aside_for_its_own_problem_causes_no_other(
    tmp_path: Path, body: str, real: str, made_up: str
) -> None:
    """With a tool or an agent set aside, the rules across keys reported it unknown (or a
    draft) where it is used, which it is not: only its own problem is news."""
    keys = {k for k, _ in problems_of(write(tmp_path, body))}
    assert real in keys
    assert made_up not in keys


def test_invalid_toml_is_a_problem_at_config(tmp_path: Path) -> None:
    problems = problems_of(write(tmp_path, "[server\nport = = 1\n"))
    assert [key for key, _ in problems] == ["config"]
    assert "TOML" in problems[0][1]


def test_a_directory_or_an_unreadable_file_is_said_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both were "is not valid TOML", which sends the operator looking for a syntax error."""
    folder = tmp_path / "mounted.toml"
    folder.mkdir()
    [(key, reason)] = problems_of(folder)
    assert key == "config"
    assert "is a directory" in reason
    locked = tmp_path / "locked.toml"
    locked.write_text("[server]\n")

    def refuse(self: Path, *args: Any, **kwargs: Any) -> Any:
        raise PermissionError(13, "Permission denied")  # as for a file of another user

    monkeypatch.setattr(Path, "open", refuse)
    [(_, reason)] = problems_of(locked)
    assert "permission denied" in reason


def test_missing_file_is_a_problem(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    problems = problems_of(missing)
    assert [key for key, _ in problems] == ["config"]
    assert "not found" in problems[0][1]
    assert "nope.toml" in problems[0][1]


# channels fail closed

TELEGRAM_OK = '[channels.telegram]\nenabled = true\nmode = "polling"\ntoken = "t"\n'
SLACK_OK = '[channels.slack]\nenabled = true\nbot_token = "xoxb"\nsigning_secret = "sig"\n'
WHATSAPP_OK = (
    "[channels.whatsapp]\nenabled = true\naccess_token = 'at'\napp_secret = 'as'\n"
    "verify_token = 'vt'\nphone_number_id = '123'\n"
)


def without(toml: str, key: str) -> str:
    lines = [line for line in toml.splitlines() if not line.startswith(f"{key} =")]
    assert len(lines) == len(toml.splitlines()) - 1, f"{key} not in the snippet"
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    ("toml", "key"),
    [
        (without(TELEGRAM_OK, "token"), "channels.telegram.token"),
        (TELEGRAM_OK.replace('token = "t"', 'token = ""'), "channels.telegram.token"),
        (
            '[server]\npublic_url = "https://bot.example.com"\n'
            '[channels.telegram]\nenabled = true\nmode = "webhook"\ntoken = "t"\n',
            "channels.telegram.webhook_secret",
        ),
        (
            # webhook mode by default once public_url is set
            '[server]\npublic_url = "https://bot.example.com"\n'
            '[channels.telegram]\nenabled = true\ntoken = "t"\n',
            "channels.telegram.webhook_secret",
        ),
        (without(SLACK_OK, "bot_token"), "channels.slack.bot_token"),
        (without(SLACK_OK, "signing_secret"), "channels.slack.signing_secret"),
        (SLACK_OK + 'mode = "socket"\n', "channels.slack.app_token"),
        (without(WHATSAPP_OK, "access_token"), "channels.whatsapp.access_token"),
        (without(WHATSAPP_OK, "app_secret"), "channels.whatsapp.app_secret"),
        (without(WHATSAPP_OK, "verify_token"), "channels.whatsapp.verify_token"),
        (without(WHATSAPP_OK, "phone_number_id"), "channels.whatsapp.phone_number_id"),
    ],
    ids=[
        "telegram-token",
        "telegram-empty-token",
        "telegram-webhook-secret",
        "telegram-default-webhook-secret",
        "slack-bot-token",
        "slack-signing-secret",
        "slack-socket-app-token",
        "whatsapp-access-token",
        "whatsapp-app-secret",
        "whatsapp-verify-token",
        "whatsapp-phone-number-id",
    ],
)
def test_enabled_channel_without_its_secret_fails_closed(
    tmp_path: Path, toml: str, key: str
) -> None:
    assert keys_of(write(tmp_path, toml)) == {key}


@pytest.mark.parametrize(
    "toml",
    [
        TELEGRAM_OK,
        '[server]\npublic_url = "https://bot.example.com"\n'
        '[channels.telegram]\nenabled = true\nmode = "webhook"\ntoken = "t"\n'
        'webhook_secret = "s"\n',
        SLACK_OK,
        SLACK_OK + 'mode = "socket"\napp_token = "xapp"\n',
        WHATSAPP_OK,
    ],
    ids=["telegram-polling", "telegram-webhook", "slack-events", "slack-socket", "whatsapp"],
)
def test_channel_with_all_its_secrets_loads(tmp_path: Path, toml: str) -> None:
    s = load_settings(write(tmp_path, toml))
    name = toml.split("[channels.")[1].split("]")[0]
    assert getattr(s.channels, name).enabled


def test_disabled_channels_need_no_secrets(tmp_path: Path) -> None:
    s = load_settings(
        write(
            tmp_path,
            "[channels.telegram]\nenabled = false\n[channels.slack]\nenabled = false\n"
            "mode = 'socket'\n[channels.whatsapp]\nenabled = false\n",
        )
    )
    assert not s.channels.slack.enabled


# queue mode and store url


@pytest.mark.parametrize("mode", ["collect", "followup", "steer", "interrupt"])
def test_queue_mode_accepts_the_four_modes(tmp_path: Path, mode: str) -> None:
    s = load_settings(write(tmp_path, f'[agent]\nqueue_mode = "{mode}"\n'))
    assert s.agent.queue_mode is QueueMode(mode)


@pytest.mark.parametrize("mode", ["lifo", "COLLECT ", "", "drop"])
def test_queue_mode_rejects_others(tmp_path: Path, mode: str) -> None:
    assert keys_of(write(tmp_path, f'[agent]\nqueue_mode = "{mode}"\n')) == {"agent.queue_mode"}


@pytest.mark.parametrize(
    ("url", "path"),
    [
        ("sqlite:///data/switchboard.db", "data/switchboard.db"),
        ("sqlite:////var/lib/switchboard/db.sqlite", "/var/lib/switchboard/db.sqlite"),
    ],
)
def test_store_url_sqlite_accepted(tmp_path: Path, url: str, path: str) -> None:
    s = load_settings(write(tmp_path, f'[store]\nurl = "{url}"\n'))
    assert s.store.url == url
    assert s.sqlite_path() == path


@pytest.mark.parametrize(
    "url",
    [
        "mysql://root@localhost/db",
        "data/switchboard.db",
        "sqlite://data/switchboard.db",
        "sqlite:///",  # no file: an in-memory database, every message lost at restart
        "sqlite:////",
        # these passed check, then crashed run with the driver's traceback
        "postgresql://postgres@127.0.0.1:99999/test",
        "postgresql://postgres@127.0.0.1:abc/test",
        "postgresql://postgres@[::1/test",
        "postgresql://postgres@127.0.0.1/test?sslmode=bogus",  # check said ok, run refused it
        # a password with URL characters: "Name or service not known", or a piece of the
        # password quoted as a bad port
        "postgresql://app:p@ss@127.0.0.1/test",
        "postgresql://app:se/cret@127.0.0.1/test",
        "postgresql://app:pa#ss@127.0.0.1/test",
        "postgresql://app:s3cr?t99@127.0.0.1:5432/test",
        "postgresql://app:9?x@127.0.0.1/test",
    ],
)
def test_store_url_rejected(tmp_path: Path, url: str) -> None:
    problems = problems_of(write(tmp_path, f'[store]\nurl = "{url}"\n'))
    assert [key for key, _ in problems] == ["store.url"]
    assert not any(secret in problems[0][1] for secret in ("cret", "pa#ss", "app:p@ss", "s3cr"))


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://user@host/db",
        "postgres://user@host/db",
        "postgresql://app:pw@db.internal:6432/switchboard",
        "postgresql://app@db.internal/switchboard?sslmode=verify-full&search_path=sb",
        "postgresql://app:p%40ss%2Fw%23rd@db.internal/switchboard",
    ],
)
def test_store_url_postgres_accepted(tmp_path: Path, url: str) -> None:
    s = load_settings(write(tmp_path, f'[store]\nurl = "{url}"\nlease_ttl_s = 5\n'))
    assert s.store.url == url
    assert s.store.lease_ttl_s == 5


# warnings


@pytest.mark.parametrize(
    ("toml", "name"),
    [(TELEGRAM_OK, "telegram"), (SLACK_OK, "slack"), (WHATSAPP_OK, "whatsapp")],
)
def test_every_platform_channel_is_available(tmp_path: Path, toml: str, name: str) -> None:
    assert settings_warnings(load_settings(write(tmp_path, toml))) == []
    assert getattr(load_settings(write(tmp_path, toml)).channels, name).enabled


def test_warning_when_no_channel_is_enabled(tmp_path: Path) -> None:
    warnings = settings_warnings(
        load_settings(write(tmp_path, "[channels.web]\nenabled = false\n"))
    )
    assert [key for key, _ in warnings] == ["channels"]
    assert "switchboard chat" in warnings[0][1]


@pytest.mark.parametrize(("timeout_s", "warned"), [(22, False), (23, True)])
def test_a_fallback_left_no_time_is_a_warning(tmp_path: Path, timeout_s: int, warned: bool) -> None:
    """The first model's retries stop at half the run (45 s by default); one call of timeout_s
    may follow, and only what is left is the fallback's."""
    path = write(
        tmp_path,
        f'[model]\nprovider = "openai"\nname = "a"\napi_key = "k"\ntimeout_s = {timeout_s}\n'
        '[model.fallback]\nprovider = "openai"\nname = "b"\napi_key = "k"\n',
    )
    keys = [key for key, _ in settings_warnings(load_settings(path))]
    assert ("model.fallback" in keys) is warned


def test_a_token_budget_the_prompt_and_tools_fill_is_a_warning(tmp_path: Path) -> None:
    """Every call repeats the system prompt and the tool definitions (about 1,800 tokens with
    the built-in tools); a budget under that passed check and every run ended unanswered."""
    toml = (
        "[agent.limits]\ntoken_budget = {}\n"
        '[agents.sales]\ninstructions = "Sell bikes."\n[agents.sales.limits]\ntoken_budget = {}\n'
    )
    s = load_settings(write(tmp_path, toml.format(1200, 7000)))
    [(key, text)] = [w for w in settings_warnings(s) if "token_budget" in w[0]]
    assert key == "agent.limits.token_budget"
    standing = standing_tokens(s.agent, s.tools.http)
    assert f"about {standing} of its 1200 tokens" in text
    assert f"at least {standing + 200 + 350}" in text
    s = load_settings(write(tmp_path, toml.format(7000, 1000)))
    assert [k for k, _ in settings_warnings(s)] == ["agents.sales.limits.token_budget"]


def test_what_every_call_repeats_grows_with_the_instructions_and_the_tools(
    tmp_path: Path,
) -> None:
    bare = load_settings(write(tmp_path, '[agent]\ninstructions = "Be brief."\n'))
    wordy = load_settings(write(tmp_path, f'[agent]\ninstructions = "{"Be brief. " * 400}"\n'))
    tooled = load_settings(
        write(
            tmp_path,
            '[agent]\ninstructions = "Be brief."\n[tools.http.order_status]\n'
            'description = "Looks up an order by its number."\n'
            'url = "https://shop.example/orders/{order_id}"\n'
            'parameters = { type = "object", properties = { order_id = { type = "string" } },'
            ' required = ["order_id"] }\n',
        )
    )
    base = standing_tokens(bare.agent, bare.tools.http)
    assert standing_tokens(wordy.agent, wordy.tools.http) >= base + 900  # 4,000 characters
    assert standing_tokens(tooled.agent, tooled.tools.http) > base + 20


def test_a_channel_section_overrides_the_queue_mode_and_debounce(tmp_path: Path) -> None:
    """DESIGN §2: queue modes overridable per channel; debounce per channel."""
    path = write(tmp_path, '[channels.web]\nqueue_mode = "followup"\ndebounce_ms = 500\n')
    web = load_settings(path).channels.web.channel_policy()
    assert (web.queue_mode, web.debounce_s) == (QueueMode.FOLLOWUP, 0.5)
    unset = load_settings(write(tmp_path, "", "empty.toml")).channels.telegram.channel_policy()
    assert (unset.queue_mode, unset.debounce_s) == (None, None)  # the agent's
    bad = write(tmp_path, '[channels.slack]\nqueue_mode = "later"\ndebounce_ms = -1\n', "b.toml")
    keys = [key for key, _ in problems_of(bad)]
    assert "channels.slack.queue_mode" in keys
    assert "channels.slack.debounce_ms" in keys


@pytest.mark.parametrize("value", ['"lots"', "true", "-1", "nan", "[1]"])
def test_a_bad_credits_per_run_is_one_problem_under_its_key(tmp_path: Path, value: str) -> None:
    """A key of two kinds (a number or "limits") was reported once per kind, under names of
    pydantic's (`quotas.credits_per_run.float`, `…literal['limits']`)."""
    problems = problems_of(write(tmp_path, f"[quotas]\ncredits_per_run = {value}\n"))
    assert [key for key, _ in problems] == ["quotas.credits_per_run"]
    assert '"limits"' in problems[0][1]


@pytest.mark.parametrize(("value", "read"), [('"limits"', "limits"), ("2", 2.0), ("0.5", 0.5)])
def test_credits_per_run_takes_a_number_or_limits(
    tmp_path: Path, value: str, read: float | str
) -> None:
    settings = load_settings(write(tmp_path, f"[quotas]\ncredits_per_run = {value}\n"))
    assert settings.quotas.credits_per_run == read


def test_an_agent_takes_each_limit_and_model_key_it_does_not_set(tmp_path: Path) -> None:
    """A partial [agents.NAME.limits] reset the others to the built-in defaults, loosening the
    caps [agent.limits] set; a model section with only a name dropped [model]'s endpoint."""
    path = write(
        tmp_path,
        '[model]\nprovider = "openai"\nbase_url = "http://127.0.0.1:9/v1"\nname = "a"\n'
        "timeout_s = 12\n"
        "[agent.limits]\nmax_tool_calls = 2\ntoken_budget = 3000\n"
        '[agents.vip]\ninstructions = "vip"\n[agents.vip.limits]\ntemperature = 0.9\n'
        '[agents.vip.model]\nname = "b"\n'
        '[agents.other]\ninstructions = "other"\n'
        '[agents.other.model]\nprovider = "anthropic"\nname = "c"\napi_key = "k"\n',
    )
    agents = load_settings(path).resolved_agents()
    vip, other = agents["vip"], agents["other"]
    limits = vip.settings.limits
    assert (limits.max_tool_calls, limits.token_budget, limits.temperature) == (2, 3000, 0.9)
    assert (vip.model.provider, vip.model.name, vip.model.timeout_s) == ("openai", "b", 12)
    assert vip.model.base_url == "http://127.0.0.1:9/v1"
    assert (other.model.provider, other.model.base_url) == ("anthropic", None)


@pytest.mark.parametrize(
    ("toml", "key"),
    [
        ('[model]\nprovider = "openai"\nname = "m"\napi_key = ""\n', "model.api_key"),
        ('[model]\nprovider = "anthropic"\nname = "m"\napi_key = "  "\n', "model.api_key"),
        ('[channels.telegram]\nenabled = true\ntoken = " "\n', "channels.telegram.token"),
        (
            '[channels.slack]\nenabled = true\nbot_token = "xoxb-1"\nsigning_secret = "\t"\n',
            "channels.slack.signing_secret",
        ),
    ],
)
def test_a_blank_secret_is_a_missing_one(tmp_path: Path, toml: str, key: str) -> None:
    """`api_key = "${OPENAI_API_KEY}"` with the variable set but empty passed validation."""
    assert key in [k for k, _ in problems_of(write(tmp_path, toml))]


def test_a_rule_across_keys_names_the_variable_that_broke_it(tmp_path: Path) -> None:
    """Field errors said "(from SWITCHBOARD__...)"; problems found across keys did not."""
    path = write(tmp_path, "")
    env = {"SWITCHBOARD__STORE__URL": "mysql://x", "SWITCHBOARD__AGENT__TOOLS": "bogus"}
    found = dict(problems_of(path, env))
    assert found["store.url"].endswith("(from SWITCHBOARD__STORE__URL)")
    assert found["agent.tools"].endswith("(from SWITCHBOARD__AGENT__TOOLS)")


@pytest.mark.parametrize(
    ("toml", "key"),
    [
        ('[server]\npublic_url = "https://"\n', "server.public_url"),  # webhook "https:/webhooks"
        ('[server]\npublic_url = "https://exa mple.com/"\n', "server.public_url"),
        ('[model]\nprovider = "openai"\nname = "m"\nbase_url = "http://"\n', "model.base_url"),
        (WHATSAPP_OK + 'api_base = "not a url"\n', "channels.whatsapp.api_base"),
        (TELEGRAM_OK + 'api_base = "https://:99999"\n', "channels.telegram.api_base"),
        # the webhook URLs printed were "https://h/?utm=1#top/webhooks/whatsapp"
        ('[server]\npublic_url = "https://bot.example.test/?utm=1#top"\n', "server.public_url"),
        ('[server]\npublic_url = "https://bot.example.test/#"\n', "server.public_url"),
        (WHATSAPP_OK + 'api_version = "latest"\n', "channels.whatsapp.api_version"),
        (WHATSAPP_OK + 'api_version = "21"\n', "channels.whatsapp.api_version"),
    ],
)
def test_a_url_without_a_host_is_refused(tmp_path: Path, toml: str, key: str) -> None:
    """Only the scheme was checked: "https://" passed, and the webhook URL printed for
    Telegram was "https:/webhooks/telegram"; WhatsApp's api_base was not checked at all."""
    assert key in [k for k, _ in problems_of(write(tmp_path, toml))]


@pytest.mark.parametrize(
    ("toml", "key"),
    [
        ("[server]\nport = true\n", "server.port"),  # was port 1
        ("[agent.limits]\nmax_steps = true\n", "agent.limits.max_steps"),
        ("[channels.web]\nflood_messages = false\n", "channels.web.flood_messages"),
        ("[quotas]\nuser_daily_credits = true\n", "quotas.user_daily_credits"),
    ],
)
def test_true_or_false_is_no_number(tmp_path: Path, toml: str, key: str) -> None:
    assert key in [k for k, _ in problems_of(write(tmp_path, toml))]


def test_numbers_and_switches_from_the_environment_still_read(tmp_path: Path) -> None:
    env = {"SWITCHBOARD__SERVER__PORT": "9000", "SWITCHBOARD__CHANNELS__WEB__ENABLED": "false"}
    s = load_settings(write(tmp_path, ""), environ=env)
    assert (s.server.port, s.channels.web.enabled) == (9000, False)


@pytest.mark.parametrize(
    ("channels", "url", "warning"),
    [
        (
            '[channels.whatsapp]\nenabled = true\naccess_token = "t"\napp_secret = "s"\n'
            'verify_token = "v"\nphone_number_id = "1"\n',
            "http://bot.example.com",
            "WhatsApp deliver webhooks only to https://",
        ),
        (
            '[channels.telegram]\nenabled = true\ntoken = "1:x"\nwebhook_secret = "s"\n',
            "https://bot.example.com:9443",
            "Telegram delivers webhooks only to ports 443, 80, 88, 8443",
        ),
        (
            '[channels.telegram]\nenabled = true\ntoken = "1:x"\nwebhook_secret = "s"\n',
            "https://bot.example.com",
            None,
        ),
        (
            '[channels.telegram]\nenabled = true\ntoken = "1:x"\nmode = "polling"\n',
            "http://x",
            None,
        ),
    ],
)
def test_a_public_url_the_platforms_will_not_call_is_warned_of(
    tmp_path: Path, channels: str, url: str, warning: str | None
) -> None:
    s = load_settings(write(tmp_path, f'[server]\npublic_url = "{url}"\n{channels}'), environ={})
    found = [m for k, m in settings_warnings(s) if k == "server.public_url"]
    assert found == ([warning] if warning else [])


def test_telegram_takes_webhooks_when_it_has_a_secret_to_check_them_by(tmp_path: Path) -> None:
    """Without a public URL it polled, even with a webhook secret set, and the route answered
    404: the updates posted to it were lost. The URL is only needed to tell Telegram where
    to deliver (`switchboard telegram set-webhook`): its absence is a warning, not an error."""
    body = '[channels.telegram]\nenabled = true\ntoken = "1:x"\nwebhook_secret = "s"\n'
    s = load_settings(write(tmp_path, body), environ={})
    assert s.channels.telegram.effective_mode(s.server.public_url) == "webhook"
    (warning,) = [m for k, m in settings_warnings(s) if k == "server.public_url"]
    assert "set-webhook" in warning
    polling = '[channels.telegram]\nenabled = true\ntoken = "1:x"\n'
    s = load_settings(write(tmp_path, polling), environ={})
    assert s.channels.telegram.effective_mode(s.server.public_url) == "polling"
    assert [k for k, _ in settings_warnings(s) if k == "server.public_url"] == []


def test_a_problem_in_a_list_set_by_a_variable_names_the_variable(tmp_path: Path) -> None:
    """A rule across keys in a list the environment set named no variable."""
    env = {"SWITCHBOARD__BINDINGS": '[{"agent": "nobody"}]'}
    problems = problems_of(write(tmp_path, ""), environ=env)
    assert ("bindings[0].agent", "no agent named 'nobody' (from SWITCHBOARD__BINDINGS)") in (
        problems
    )


def test_an_https_public_url_without_trusted_forwarding_is_warned_of(tmp_path: Path) -> None:
    """Behind a TLS proxy the gateway sees plain HTTP from the proxy: cookies lost Secure and
    the embedded chat broke, with nothing said."""
    url = '[server]\npublic_url = "https://chat.example"\n'
    s = load_settings(write(tmp_path, url), environ={})
    assert "server.trust_forwarded" in [k for k, _ in settings_warnings(s)]
    s = load_settings(write(tmp_path, url + "trust_forwarded = true\n"), environ={})
    assert "server.trust_forwarded" not in [k for k, _ in settings_warnings(s)]
