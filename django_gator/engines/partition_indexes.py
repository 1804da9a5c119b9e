"""Where each index of the plain jobs table goes in the partitioned layout
(engines/partitions.py), and its extended statistics."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from django_gator.states import ACTIVE_STATES, JobState, sql_list


def local_leaves(definition: str, unique: bool) -> list[str]:
    """The list partitions (``active``, ``dead``) an index of the plain table goes on by
    itself, or none: then it goes on the parent, so every partition has it. The unique
    jobs' index goes on the active partition (see the module's docstring); so does each
    partial index whose condition holds only for states of the active and dead partitions
    (the claim's, the rescue's, the dead-job screen's): the finished jobs' partitions
    would only carry them empty, and each success mark would open them."""
    if unique:
        return ["active"]
    where = definition.partition(" WHERE ")[2].replace(" IS NOT NULL", " IS NULL")
    if "(state)" not in where or "<>" in where or "NOT " in where.upper():
        return []  # a condition that may hold for a finished job (or not read here)
    named = set(re.findall(r"'([a-z]+)'", where)) & set(JobState.values)
    if not named or named & {JobState.SUCCEEDED.value, JobState.CANCELLED.value}:
        return []
    leaves = ["active"] if named & {state.value for state in ACTIVE_STATES} else []
    return leaves + (["dead"] if JobState.DEAD.value in named else [])


#: The condition the conversion gives a full index that leads with ``state``.
FINISHED_ONLY = (
    f" WHERE state IN {sql_list([JobState.SUCCEEDED, JobState.CANCELLED, JobState.DEAD])}"
)


def finished_only(definition: str) -> str:
    """A full index that leads with ``state`` (``gator_job_state_finished``) made partial:
    the finished states only. In the active partition it would hold every job and take a
    write at every claim and mark, and the planner would read it for the active states that
    the marks name (to prune the partitions) instead of finding each row by its primary key.
    The queries it serves (pruning, the finished jobs' counts and filters) ask for finished
    states, which imply the condition."""
    columns = definition.partition(" USING btree ")[2]
    if " WHERE " in definition or not columns.startswith("(state"):
        return definition
    return definition + FINISHED_ONLY


#: pg_statistic_ext.stxkind letters: the kinds CREATE STATISTICS names.
STATISTICS_KINDS = {"d": "ndistinct", "f": "dependencies", "m": "mcv"}


def move_statistics(cursor: Any, qn: Callable[[str], str], source: str, target: str) -> None:
    """The extended statistics objects of table ``source`` (migration 0030's) re-created,
    same names, on ``target``: such an object belongs to its table, so a conversion would
    leave it on the kept plain table, and a revert drop it with the partitioned one."""
    cursor.execute(
        "SELECT s.stxname, pg_get_statisticsobjdef_columns(s.oid), s.stxkind::text[]"
        " FROM pg_statistic_ext s WHERE s.stxrelid = to_regclass(%s)",
        [source],
    )
    for name, columns, kinds in cursor.fetchall():
        named = ", ".join(STATISTICS_KINDS[k] for k in kinds if k in STATISTICS_KINDS)
        kinds_sql = f" ({named})" if named else ""  # one expression's: no kinds to name
        cursor.execute(f"DROP STATISTICS {qn(name)}")
        cursor.execute(f"CREATE STATISTICS {qn(name)}{kinds_sql} ON {columns} FROM {qn(target)}")
