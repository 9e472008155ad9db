"""Which worker of a study's run measures the best configs again at the end (the walk's D2:
each of three workers re-measured its own "top 3", three different sets side by side).

A worker that ends its search marks it in the store (a claim of no config: atomic as claims
are). While another live worker of the study has not marked its own, this one leaves the
re-measure to it: the last to finish searching takes in the trials every worker measured and
settles the study's best, once. Two that finish together both see the other's mark, and the
first to claim the run's settle mark does it. A worker whose store cannot be read settles over
what it measured itself, as a lone worker does.
"""

from __future__ import annotations

import socket

from sqlalchemy import select

from sweeper.errors import SweeperError
from sweeper.joining import process_alive
from sweeper.store import Store
from sweeper.store.models import ClaimRow, StudyRow
from sweeper.store.store import utcnow
from sweeper.sweep.share import the_run

MARK = -1  # the trial number of a claim that marks a worker's stage, not a config
SEARCHED, SETTLES = "searched:", "settles:"


def _marked(store: Store, study: str) -> set[str]:
    """The study's stage marks (claims of trial number ``MARK``)."""
    with store.session() as s:
        study_id = s.scalar(select(StudyRow.id).where(StudyRow.name == study))
        return set(
            s.scalars(
                select(ClaimRow.config_key).where(
                    ClaimRow.study_id == study_id, ClaimRow.trial_number == MARK
                )
            )
        )


def leaves_it(store: Store, study: str, worker_id: str, grace_s: float) -> str | None:
    """Why this worker, its search over, leaves the study's end re-measure to another worker
    of its run (in words); None: it does it."""
    try:
        store.claim(study, SEARCHED + worker_id, MARK, worker_id)
        host = socket.gethostname()
        others = [
            w
            for w in store.live_workers(study, grace_s)
            if w.id != worker_id and (w.host != host or process_alive(w.pid))
        ]
        marked = _marked(store, study)
        searching = [w for w in others if SEARCHED + w.id not in marked]
        if searching:
            n = len(searching)
            return (
                f"{n} other worker{'s' if n > 1 else ''} of this study "
                f"{'are' if n > 1 else 'is'} still searching: the last to finish measures "
                "the study's best configs again, over every worker's trials"
            )
        workers = [w for w, _ in store.list_workers(study)]
        run = the_run(workers, worker_id, utcnow())
        first = run[0].id if run else worker_id
        if store.claim(study, SETTLES + first, MARK, worker_id) is None:
            return None
        return "another worker of this study's run measures its best configs again"
    except SweeperError:
        return None
