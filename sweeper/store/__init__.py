"""Storage: our typed tables beside Optuna's, in SQLite or Postgres."""

from sweeper.store.models import StudyRow, TrialMetrics, TrialRow
from sweeper.store.store import Store, redact

__all__ = ["Store", "StudyRow", "TrialMetrics", "TrialRow", "redact"]
