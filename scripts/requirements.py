"""Print sweeper's requirements from pyproject.toml, one per line, for pip's ``-r``.

    python scripts/requirements.py                              # the runtime dependencies
    python scripts/requirements.py --extra dev --without torch accelerate

``--without`` leaves packages out by name: the controller's test environment (no torch, so
Python 3.12/3.13 never pull a CUDA build) and the wheelhouse (the user's torch is never
replaced). Needs only the standard library (Python 3.11+).
"""

from __future__ import annotations

import argparse
import re
import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def canonical(name: str) -> str:
    """PEP 503 name: ``Jinja2`` and ``jinja2``, ``psycopg[binary]`` and ``psycopg`` match."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    if match is None:
        raise SystemExit(f"error: cannot read the requirement {requirement!r} in {PYPROJECT}")
    return canonical(match.group(1))


def requirements(extras: list[str], without: list[str]) -> list[str]:
    project = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]
    optional = project.get("optional-dependencies", {})
    unknown = [e for e in extras if e not in optional]
    if unknown:
        raise SystemExit(
            f"error: no extra {', '.join(unknown)} in {PYPROJECT}; extras: {', '.join(optional)}"
        )
    listed = list(project["dependencies"])
    pending, seen = list(extras), set()
    while pending:  # an extra may name another of the project's own: "sweeper[test]"
        extra = pending.pop(0)
        if extra in seen:
            continue
        seen.add(extra)
        for requirement in optional[extra]:
            if requirement_name(requirement) == canonical(project["name"]):
                pending += re.findall(r"[A-Za-z0-9_-]+", requirement.split("[", 1)[1])
            else:
                listed.append(requirement)
    dropped = {canonical(n) for n in without}
    return [r.split("#")[0].strip() for r in listed if requirement_name(r) not in dropped]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--extra", action="append", default=[], help="an optional extra")
    parser.add_argument("--without", nargs="*", default=[], help="package names to leave out")
    args = parser.parse_args()
    print("\n".join(requirements(args.extra, args.without)))


if __name__ == "__main__":
    main()
