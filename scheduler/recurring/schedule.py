"""A schedule's row lives in ``scheduler.schedule`` (the store reads and writes it, and a
store must not import the recurring layer); this name is kept for the callers of the old
path, the benchmarks."""

from ..schedule import (
    DEFAULT_CATCHUP_WINDOW_S,
    MAX_JITTER_S,
    MAX_SCHEDULE_ID_BYTES,
    Misfire,
    Occurrence,
    Overlap,
    Schedule,
    State,
    aware_ms,
    check_jitter,
    check_schedule_id,
    check_window,
    choice,
    occurrence_id,
    parse_occurrence,
)

__all__ = ["DEFAULT_CATCHUP_WINDOW_S", "MAX_JITTER_S", "MAX_SCHEDULE_ID_BYTES",
           "Misfire", "Occurrence", "Overlap", "Schedule", "State", "aware_ms", "check_jitter",
           "check_schedule_id", "check_window", "choice", "occurrence_id", "parse_occurrence"]
