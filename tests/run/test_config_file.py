"""STOPDESK_CONFIG_FILE: each bad input is one line at start-up naming the file, the key and what is
wrong; a good one reaches the settings; no file leaves the settings as they were."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
import yaml

from reconcile.mechanisms.base import MechanismSettings
from reconcile.mechanisms.mcp.servers import ServerConfigError, configured_servers
from stopdesk import config_file
from stopdesk.config import PREFIX, ConfigError
from tests.run.helpers import ROOT, clean_env, run
from tests.run.test_config_errors import one_line

SHOW = (
    "from django.conf import settings; import json; m = settings.STOPDESK_MECHANISMS; "
    "print(json.dumps({'servers': sorted(m.get('mcp', {}).get('options', {}).get('servers', {})), "
    "'systems': sorted(m['http']['options']['systems']), 'mcp_deadline': m.get('mcp', {}).get('deadline_s'), "
    "'openai': m['openai']['options']}))"
)


def last_line(stdout: str) -> dict:
    # `shell` may first say what it imported.
    return json.loads(stdout.strip().splitlines()[-1])


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "stopdesk.toml"
    path.write_text(text)
    return str(path)


def error_of(path: str) -> str:
    with pytest.raises(ConfigError) as caught:
        config_file.read(path)
    return caught.value.message


@pytest.mark.parametrize(
    ("text", "key", "says"),
    [
        ("[mechanisms.fax]\ndeadline_s = 5\n", "mechanisms.fax", "there is no mechanism called 'fax'"),
        ("[mechanisms.http]\ndeadline = 5\n", "mechanisms.http.deadline", "there is no such key"),
        ('[mechanisms.http]\ndeadline_s = "5"\n', "mechanisms.http.deadline_s", "expected a number"),
        ("[mechanisms.http]\ndeadline_s = 0\n", "mechanisms.http.deadline_s", "must be more than 0"),
        ("[mechanisms.mcp]\nconcurrency = 1.5\n", "mechanisms.mcp.concurrency", "expected a whole number"),
        ('[mechanisms.openai]\nbase_url = "ftp://x/v1"\n', "mechanisms.openai.base_url", "is not an http(s) URL"),
        ('[mechanisms.openai]\napi_key = "sk-123"\n', "mechanisms.openai.api_key", "with 'api_key_env'"),
        ('[mcp.servers.r]\nurl = "file:///etc/passwd"\n', "mcp.servers.r.url", "is not an http(s) URL"),
        ('[mcp.servers.r]\nurl = "http://h/mcp"\nbearer_token = "t"\n', "mcp.servers.r.bearer_token", "secrets"),
        ('[mcp.servers.r]\nurl = "http://h/mcp"\nheaders = {X = "v"}\n', "mcp.servers.r.headers", "headers_env"),
        (
            '[mcp.servers.r]\nurl = "http://h/mcp"\nbearer_token_env = "NO_SUCH_VAR_SET"\n',
            "bearer_token_env",
            "NO_SUCH_VAR_SET, which is not set",
        ),
        (
            '[mcp.servers.r]\nurl = "http://h/mcp"\nheaders_env = {X = "NO_SUCH_VAR_SET"}\n',
            "mcp.servers.r.headers_env.X",
            "not set",
        ),
        ('[mcp.servers.r]\nurl = "http://h/mcp"\ncommand = "x"\n', "mcp.servers.r", "exactly one of 'url'"),
        ('[mcp.servers.r]\ncommand = "x"\nargs = "a b"\n', "mcp.servers.r.args", "expected a list of strings"),
        ("[mcp]\nserver = 1\n", "mcp.server", "there is no such key"),
        (
            '[mcp.servers.r]\nurl = "http://h/mcp"\nrevision = "2024-11-05"\n',
            "mcp.servers.r.revision",
            "'2024-11-05' is not a revision; use one of auto, 2026-07-28, 2025-11-25",
        ),
        (
            '[mcp.servers.r]\nurl = "http://h/mcp"\n[mcp.servers.r.tools.export.status_check]\narguments = {}\n',
            "mcp.servers.r.tools.export.status_check",
            "needs the 'tool'",
        ),
        ('[mcp.servers.r]\nurl = "http://[::1/mcp"\n', "mcp.servers.r.url", "is not an http(s) URL"),
        ('[mcp.servers.r]\nurl = "http://h/mcp"\ntrusted = "yes"\n', "mcp.servers.r.trusted", "expected true or false"),
        (
            '[mcp.servers.r]\nurl = "http://h/mcp"\n[mcp.servers.r.tools.send]\nidempotent = 1\n',
            "mcp.servers.r.tools.send.idempotent",
            "expected true or false, got a number",
        ),
        (
            '[mcp.servers.r]\nurl = "http://h/mcp"\n[mcp.servers.r.tools.send]\nidempotant = true\n',
            "mcp.servers.r.tools.send.idempotant",
            "there is no such key; use one of idempotent, status_check, task",
        ),
        ('[http.systems.crm]\nbase_url = "crm.example"\n', "http.systems.crm.base_url", "is not an http(s) URL"),
        ('[http.systems.crm]\nlookup_url = "/x"\n', "http.systems.crm", "needs its 'base_url'"),
        ('[http.systems.crm]\nbase_url = "http://c"\nlookup = "/x"\n', "http.systems.crm.lookup", "no such key"),
        (
            '[http.systems.crm]\nbase_url = "http://c"\nrecord_url = "records/{record_id}"\n',
            "record_url",
            "a path starting with /",
        ),
        (
            '[http.systems.crm]\nbase_url = "http://c"\nreverse = {action = "archive"}\n',
            "http.systems.crm.reverse",
            "needs its 'action' and its 'url'",
        ),
        (
            '[http.systems.crm]\nbase_url = "http://c"\n[http.systems.crm.reverse]\naction = "a"\nurl = "/a"\nverb = "POST"\n',
            "reverse.verb",
            "no such key",
        ),
        ("[queues]\nx = 1\n", "queues", "there is no such key; use one of http, mcp, mechanisms"),
        ("[mechanisms\n", "", "is not valid TOML"),
    ],
)
def test_each_bad_input_names_the_file_the_key_and_what_is_wrong(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, key: str, says: str
) -> None:
    monkeypatch.delenv("NO_SUCH_VAR_SET", raising=False)
    path = write(tmp_path, text)
    message = error_of(path)
    assert message.startswith(f"STOPDESK_CONFIG_FILE {path}"), message
    assert key in message and says in message, message


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    assert "does not exist" in error_of(str(tmp_path / "absent.toml"))


def test_a_secret_is_read_from_its_variable_and_never_taken_from_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_KEY_FOR_TEST", "sk-from-env")
    monkeypatch.setenv("MCP_TOKEN_FOR_TEST", "tok")
    found = config_file.read(
        write(
            tmp_path,
            '[mechanisms.openai]\napi_key_env = "OPENAI_KEY_FOR_TEST"\n'
            '[mcp.servers.r]\nurl = "https://h/mcp"\nbearer_token_env = "MCP_TOKEN_FOR_TEST"\n'
            '[mcp.servers.git]\ncommand = "mcp-server-git"\nenv_from = {GITHUB_TOKEN = "MCP_TOKEN_FOR_TEST"}\n',
        )
    )
    assert found["openai"]["options"] == {"api_key": "sk-from-env"}
    servers = found["mcp"]["options"]["servers"]
    # servers.py reads a bearer token's variable each time it connects; the file only names it.
    assert servers["r"] == {"url": "https://h/mcp", "bearer_token_env": "MCP_TOKEN_FOR_TEST"}
    assert servers["git"] == {"command": "mcp-server-git", "env": {"GITHUB_TOKEN": "tok"}}


def test_a_trusted_server_and_an_idempotent_tool_reach_the_server_configuration(tmp_path: Path) -> None:
    found = config_file.read(
        write(
            tmp_path,
            '[mcp.servers.r]\nurl = "https://h/mcp"\ntrusted = true\n'
            "[mcp.servers.r.tools.lookup]\nidempotent = true\n[mcp.servers.r.tools.send]\nidempotent = false\n"
            "[mcp.servers.r.tools.export]\ntask = true\n",
        )
    )
    spec = configured_servers(found["mcp"]["options"])["r"]
    assert spec.trusted is True and spec.idempotent_tools == frozenset({"lookup"})
    assert spec.task_tools == frozenset({"export"})  # run as a task for a 2026-07-28 client that can take one
    assert configured_servers({"servers": {"r": {"url": "https://h/mcp"}}})["r"].trusted is False


@pytest.mark.parametrize(
    ("server", "says"),
    [
        ({"trusted": "yes"}, "mcp server 'r': 'trusted' must be true or false, not 'yes'"),
        ({"tools": {"send": {"idempotent": 1}}}, "mcp server 'r', tool 'send': 'idempotent' must be true or false"),
        ({"tools": {"export": {"task": "yes"}}}, "mcp server 'r', tool 'export': 'task' must be true or false"),
    ],
)
def test_a_settings_module_server_with_a_flag_that_is_not_true_or_false_is_refused(server: dict, says: str) -> None:
    with pytest.raises(ServerConfigError) as caught:
        configured_servers({"servers": {"r": {"url": "https://h/mcp", **server}}})
    assert says in str(caught.value)


def test_the_file_merges_over_the_settings_and_the_timing_variables_win(tmp_path: Path) -> None:
    base = {
        "http": {
            "deadline_s": 300.0,
            "options": {"systems": {"crm": {"base_url": "http://a"}, "outbox": {"base_url": "http://o"}}},
        },
        "openai": {"options": {"base_url": "", "api_key": ""}},
    }
    path = write(
        tmp_path,
        '[mechanisms.http]\ndeadline_s = 60\ncall_timeout_s = 5\n[mechanisms.openai]\nbase_url = "http://llm/v1"\n'
        '[http.systems.crm]\nbase_url = "https://crm.example"\n',
    )
    result = config_file.merged(base, path, environment={"http": {"deadline_s": 90.0}})
    assert result["http"]["deadline_s"] == 90.0 and result["http"]["call_timeout_s"] == 5.0
    # A system of the same name is replaced whole; the others stay.
    assert result["http"]["options"]["systems"] == {
        "crm": {"base_url": "https://crm.example"},
        "outbox": {"base_url": "http://o"},
    }
    assert result["openai"]["options"] == {"base_url": "http://llm/v1", "api_key": ""}
    assert base["http"]["deadline_s"] == 300.0, "the settings' own dict is not changed"


def test_the_timing_keys_are_the_mechanism_settings_fields() -> None:
    fields = {f.name for f in dataclasses.fields(MechanismSettings)} - {"options"}
    assert set(config_file.TIMING_KEYS) == fields


def test_the_example_in_the_operations_guide_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = (ROOT / "docs" / "OPERATIONS.md").read_text()
    example = re.search(r"```toml\n(.*?)```", text, re.S)
    assert example, "docs/OPERATIONS.md shows a stopdesk.toml"
    for variable in re.findall(r'"([A-Z][A-Z0-9_]+)"', example[1]):
        monkeypatch.setenv(variable, "x")
    found = config_file.read(write(tmp_path, example[1]))
    assert found["mcp"]["options"]["servers"] and found["http"]["options"]["systems"]


def test_at_start_up_a_bad_file_is_one_line_and_a_good_one_reaches_the_settings(tmp_path: Path) -> None:
    env = clean_env(tmp_path)
    before = last_line(run(["manage.py", "shell", "-c", SHOW], env).stdout)
    assert before["servers"] == [] and before["systems"] == ["crm", "outbox"]

    env["STOPDESK_CONFIG_FILE"] = write(tmp_path, '[mcp.servers.research]\nurl = "tools.example/mcp"\n')
    line = one_line(run(["manage.py", "check"], env))
    assert line == (
        f"{PREFIX}STOPDESK_CONFIG_FILE {env['STOPDESK_CONFIG_FILE']}: mcp.servers.research.url: "
        "'tools.example/mcp' is not an http(s) URL (http://HOST/...)."
    )

    write(
        tmp_path,
        '[mechanisms.mcp]\ndeadline_s = 30\n[mcp.servers.research]\nurl = "https://tools.example/mcp"\n'
        '[http.systems.billing]\nbase_url = "https://billing.example"\n',
    )
    env["STOPDESK_MCP_DEADLINE_SECONDS"] = "45"
    after = last_line(run(["manage.py", "shell", "-c", SHOW], env).stdout)
    assert after["servers"] == ["research"] and after["systems"] == ["billing", "crm", "outbox"]
    assert after["mcp_deadline"] == 45.0, "the timing variable wins over the file"
    assert after["openai"] == before["openai"]


def test_the_compose_file_mounts_the_shipped_file_which_changes_nothing() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    for name in ("web", "watch", "worker", "beat", "migrate"):
        service = compose["services"][name]
        assert "./config:/etc/stopdesk:ro" in service["volumes"], name
        assert service["environment"]["STOPDESK_CONFIG_FILE"] == "${STOPDESK_CONFIG_FILE:-}", name
    assert config_file.read(str(ROOT / "config" / "stopdesk.toml")) == {}
