"""The production shape: docker-compose.yml parses and every service has a health check."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.run.helpers import ROOT

SERVICES = {"web", "worker", "beat", "db", "redis"}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_compose_names_every_service_with_a_health_check(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert set(services) >= SERVICES
    for name, service in services.items():
        check = service.get("healthcheck")
        assert check and check.get("test"), f"{name} has no health check"
        assert check["test"][0] in ("CMD", "CMD-SHELL"), name


def test_app_services_share_one_database_and_one_broker_and_wait_for_them(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name in ("web", "worker", "beat"):
        env = services[name]["environment"]
        assert env["DATABASE_URL"].startswith("postgres://") and "@db:5432/" in env["DATABASE_URL"], name
        assert env["CELERY_BROKER_URL"].startswith("redis://redis:6379"), name
        depends = services[name]["depends_on"]
        assert depends["db"]["condition"] == "service_healthy", name
        assert depends["redis"]["condition"] == "service_healthy", name
    assert "healthz" in " ".join(services["web"]["healthcheck"]["test"])


def test_data_lives_in_named_volumes(compose: dict[str, Any]) -> None:
    volumes = set(compose["volumes"])
    mounted = {m.split(":", 1)[0] for s in ("db", "redis") for m in compose["services"][s]["volumes"]}
    assert mounted <= volumes and len(mounted) == 2


def test_the_image_runs_the_entry_point_that_checks_configuration() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["python", "-m", "stopdesk"]' in dockerfile
    assert "collectstatic" in dockerfile


def test_the_stop_watch_is_served_under_asgi_on_the_same_database(compose: dict[str, Any]) -> None:
    watch = compose["services"]["watch"]
    assert watch["command"] == ["watch"]
    assert watch["environment"]["DATABASE_URL"] == compose["services"]["web"]["environment"]["DATABASE_URL"]
    main = (ROOT / "stopdesk" / "__main__.py").read_text()
    assert '"uvicorn", "stopdesk.asgi:application"' in main


def test_the_web_service_sends_watches_to_the_watch_service(compose: dict[str, Any]) -> None:
    web_env = compose["services"]["web"]["environment"]
    published = compose["services"]["watch"]["ports"][0]
    assert web_env["STOPDESK_WATCH_URL"] == "${STOPDESK_WATCH_URL:-http://localhost:8001}"
    assert published.endswith(":8001") and "8001" in web_env["STOPDESK_WATCH_URL"]


def test_the_mcp_gateway_runs_its_command_on_the_same_database_and_checks_its_health(compose: dict[str, Any]) -> None:
    gateway = compose["services"]["mcp-gateway"]
    assert gateway["command"] == ["mcp-gateway"]
    assert gateway["environment"]["DATABASE_URL"] == compose["services"]["web"]["environment"]["DATABASE_URL"]
    assert (
        gateway["environment"]["STOPDESK_CONFIG_FILE"]
        == compose["services"]["web"]["environment"]["STOPDESK_CONFIG_FILE"]
    )
    assert "8002/healthz" in " ".join(gateway["healthcheck"]["test"])


def test_worker_and_beat_health_checks_read_their_heartbeats(compose: dict[str, Any]) -> None:
    for name in ("worker", "beat"):
        assert compose["services"][name]["healthcheck"]["test"] == ["CMD", "python", "-m", "stopdesk", "ready", name]
