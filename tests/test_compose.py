"""docker-compose.yml wires postgres, the API and a GPU worker to one Postgres URL.

No Docker engine runs on CI machines, so this checks the file's structure, not a live stack.
"""

from __future__ import annotations

import yaml

from tests.helpers import REPO


def test_compose_services_share_one_storage_url() -> None:
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    services = compose["services"]
    assert set(services) == {"db", "api", "worker"}
    assert "pg_isready" in " ".join(services["db"]["healthcheck"]["test"])
    assert any(v.startswith("pgdata:") for v in services["db"]["volumes"])
    urls = {services[name]["environment"]["SWEEPER_STORAGE"] for name in ("api", "worker")}
    assert len(urls) == 1 and next(iter(urls)).startswith("postgresql+psycopg://")
    for name in ("api", "worker"):
        assert services[name]["depends_on"]["db"]["condition"] == "service_healthy"
    (device,) = services["worker"]["deploy"]["resources"]["reservations"]["devices"]
    assert device["capabilities"] == ["gpu"] and device["driver"] == "nvidia"
    assert "spaces/h100.yaml" in services["worker"]["command"]
    assert services["api"]["ports"] == ["127.0.0.1:8000:8000"]
