"""One router per resource: ``studies`` (REST under /api) and ``pages`` (HTML dashboard)."""
