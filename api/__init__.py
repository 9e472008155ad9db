"""The HTTP side of sweeper: REST API under /api and the dashboard pages, served by FastAPI."""

from api.app import create_app

__all__ = ["create_app"]
