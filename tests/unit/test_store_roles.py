"""The store's role protocols (``scheduler/store/roles.py``): both stores satisfy every
one, every public method of ``Store`` is in at least one, and the modules that name
store methods by string (effects) name only those of the roles they are meant to use."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from scheduler.poller.reader import ReaderStore
from scheduler.poller.shared import PollerStore
from scheduler.store import roles
from scheduler.store.base import Store
from scheduler.store.cassandra.store import CassandraStore
from scheduler.store.roles import (
    ROLES,
    AuditReads,
    BucketReads,
    Checkpoints,
    Connection,
    DeadLetters,
    ExporterReads,
    Firing,
    Flow,
    JobReads,
    JobWrites,
    Meta,
    Ownership,
    RowReads,
    ScheduleReads,
    Schedules,
    Schema,
    ShardReads,
    TimedReads,
)
from scheduler.store.sqlite.store import SqliteStore

ROOT = Path(__file__).resolve().parents[2] / "scheduler"


def _statically(sq: SqliteStore, cs: CassandraStore, store: Store) -> None:
    """Never called: mypy checks these assignments, so a store that stops satisfying a
    role (a renamed parameter, a changed return type) fails ``mypy``."""
    for s in (sq, cs, store):
        meta: Meta = s
        job_reads: JobReads = s
        job_writes: JobWrites = s
        bucket_reads: BucketReads = s
        firing: Firing = s
        ownership: Ownership = s
        checkpoints: Checkpoints = s
        dead_letters: DeadLetters = s
        schedules: Schedules = s
        flow: Flow = s
        schema: Schema = s
        connection: Connection = s
        timed: TimedReads = s
        shard_reads: ShardReads = s
        row_reads: RowReads = s
        audit_reads: AuditReads = s
        schedule_reads: ScheduleReads = s
        exporter_reads: ExporterReads = s
        poller: PollerStore = s
        reader: ReaderStore = s
        del (meta, job_reads, job_writes, bucket_reads, firing, ownership, checkpoints, dead_letters,
             schedules, flow, schema, connection, timed, shard_reads, row_reads, audit_reads, schedule_reads,
             exporter_reads, poller, reader)


def members(role: type) -> set[str]:
    """The names a protocol declares itself or inherits from other protocols."""
    out: set[str] = set()
    for cls in role.__mro__:
        if cls in (object, role.__mro__[-1]) or not getattr(cls, "_is_protocol", False):
            continue
        out |= {n for n in vars(cls) if not n.startswith("_")}
        out |= {n for n in getattr(cls, "__annotations__", {}) if not n.startswith("_")}
    return out


def public_of_store() -> set[str]:
    names = {n for n in dir(Store) if not n.startswith("_")} | set(Store.__annotations__)
    return {n for n in names if not n.startswith("_")}


def test_every_public_method_of_store_is_in_a_role():
    covered = set().union(*(members(r) for r in ROLES))
    assert public_of_store() - covered == set()
    assert covered - public_of_store() == set(), "a role names nothing Store lacks"


def test_the_roles_are_a_partition_of_store():
    # Each method in exactly one role: an intersection protocol says what a consumer
    # combines, a role never repeats another's method.
    seen: dict[str, str] = {}
    for role in ROLES:
        for name in members(role):
            assert name not in seen, f"{name} is in {seen.get(name)} and {role.__name__}"
            seen[name] = role.__name__


@pytest.mark.parametrize("role", ROLES, ids=lambda r: r.__name__)
@pytest.mark.parametrize("impl", [SqliteStore, CassandraStore], ids=lambda c: c.__name__)
def test_both_stores_have_each_method_of_each_role_with_stores_parameters(role, impl):
    for name in members(role):
        if name == "url":  # an instance attribute, set by the constructor
            continue
        assert callable(getattr(impl, name)) or isinstance(getattr(impl, name), property)
        declared, actual = inspect.getattr_static(role, name), inspect.getattr_static(Store, name)
        if isinstance(declared, property):
            assert isinstance(actual, property), name
            continue
        params = list(inspect.signature(declared).parameters)
        assert params == list(inspect.signature(actual).parameters), name


def test_the_intersections_are_made_of_roles_only():
    for name in roles.__all__:
        proto = getattr(roles, name)
        if proto is ROLES or proto in ROLES:
            continue
        assert members(proto) <= set().union(*(members(r) for r in ROLES))
        assert not {n for n in vars(proto) if not n.startswith("_")}, f"{name} declares its own methods"


# --- modules that call the store by name (scheduler.domain.effects.call) -------------------

EFFECT_MODULES: dict[str, tuple[type, ...]] = {
    "producer/producer.py": (Meta, JobReads, JobWrites, DeadLetters),
    "producer/repair.py": (BucketReads, JobWrites),
    "producer/replay.py": (DeadLetters,),
    "producer/jobview.py": (JobReads, DeadLetters),
    "producer/nudger.py": (Checkpoints,),
    "producer/occurrences.py": (JobWrites,),
    "producer/recurring.py": (JobReads, Schedules),
    "observe/chains.py": (ScheduleReads,),
    "api/jobs.py": (JobReads,),  # the ids of a batch already stored, for its 409s
}


def called_by_name(path: Path) -> set[str]:
    """The store methods a module names in ``call("method", ...)``."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "call"
                and node.args and isinstance(node.args[0], ast.Constant)):
            out.add(str(node.args[0].value))
    return out


@pytest.mark.parametrize("module", sorted(EFFECT_MODULES))
def test_an_effect_module_names_only_methods_of_its_roles(module):
    allowed = set().union(*(members(r) for r in EFFECT_MODULES[module]))
    names = called_by_name(ROOT / module)
    assert names, "the module names store methods (else drop it from the table)"
    assert names - allowed == set()


def test_every_module_that_names_store_methods_is_in_the_table():
    found = {str(p.relative_to(ROOT)) for p in ROOT.rglob("*.py")
             if p.name != "effects.py" and called_by_name(p)}
    assert found == set(EFFECT_MODULES)


def test_the_check_sees_a_method_outside_the_roles(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text('def f():\n    yield from call("apply_schema", None, 0)\n')
    assert called_by_name(bad) - members(JobWrites) == {"apply_schema"}
