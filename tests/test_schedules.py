"""Cron schedules: occurrences in wall-clock time across DST changes, misfire and overlap
policies, declared schedules, the admin form, and three worker processes dispatching each
occurrence exactly once."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from django_gator import Queueable
from django_gator.admin import ScheduleForm
from django_gator.cron import occurrences, to_utc, validate_cron
from django_gator.models import Job, JobState, Schedule, ScheduledRun, ScheduleSource
from django_gator.queueable import unregister
from django_gator.schedules import Cron
from django_gator.worker.scheduler import Scheduler
from tests.clock import set_file_clock
from tests.conftest import wait_for, worker_output
from tests.testapp.jobs import Noop, Record

pytestmark = pytest.mark.django_db(transaction=True)

T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


class Clock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


def make_schedule(cron: str = "*/5 * * * *", **fields: object) -> Schedule:
    schedule = Schedule(name=fields.pop("name", "every-5"), job_name=Noop.name, cron=cron)
    schedule.anchor_at = T0
    for key, value in fields.items():
        setattr(schedule, key, value)
    schedule.save()
    return schedule


# -- occurrences and time zones ---------------------------------------------------------------


def test_occurrences_in_utc():
    assert list(occurrences("*/20 * * * *", "UTC", T0, T0 + timedelta(hours=1))) == [
        T0 + timedelta(minutes=20),
        T0 + timedelta(minutes=40),
        T0 + timedelta(hours=1),
    ]


def test_a_time_in_the_skipped_spring_hour_runs_when_the_clock_jumps():
    # Europe/Berlin, 2026-03-29: 02:00 CET becomes 03:00 CEST (01:00 UTC). 02:30 never
    # happens; it runs at the jump, 03:00 CEST. Read with the old offset it would have been
    # 01:30 UTC (03:30 CEST), half an hour late.
    runs = list(occurrences("30 2 * * *", "Europe/Berlin", utc(2026, 3, 27), utc(2026, 3, 31)))
    assert runs == [
        utc(2026, 3, 27, 1, 30),  # 02:30 CET
        utc(2026, 3, 28, 1, 30),
        utc(2026, 3, 29, 1, 0),  # the jump
        utc(2026, 3, 30, 0, 30),  # 02:30 CEST
    ]


def test_a_time_in_the_repeated_autumn_hour_runs_once():
    # 2026-10-25: 03:00 CEST becomes 02:00 CET; 02:30 happens at 00:30 and 01:30 UTC.
    runs = list(occurrences("30 2 * * *", "Europe/Berlin", utc(2026, 10, 24), utc(2026, 10, 27)))
    assert runs == [
        utc(2026, 10, 24, 0, 30),  # CEST
        utc(2026, 10, 25, 0, 30),  # the first 02:30 only
        utc(2026, 10, 26, 1, 30),  # CET
    ]


def test_several_skipped_occurrences_fold_into_the_jump():
    runs = list(
        occurrences("*/20 * * * *", "Europe/Berlin", utc(2026, 3, 29, 0, 30), utc(2026, 3, 29, 2))
    )
    # 01:40 CET (00:40Z), then 02:00/02:20/02:40 (skipped) -> the jump at 01:00Z, then CEST.
    assert runs == [
        utc(2026, 3, 29, 0, 40),
        utc(2026, 3, 29, 1, 0),
        utc(2026, 3, 29, 1, 20),
        utc(2026, 3, 29, 1, 40),
        utc(2026, 3, 29, 2, 0),
    ]


def test_to_utc_of_ordinary_times():
    from zoneinfo import ZoneInfo

    zone = ZoneInfo("America/New_York")
    assert to_utc(datetime(2026, 7, 1, 12, 0), zone) == utc(2026, 7, 1, 16, 0)


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("61 * * * *", "not a valid cron expression: its minute field '61' is not valid"),
        ("0 25 * * *", "its hour field '25' is not valid \\(values 0-23"),
        ("0 0 * 13 *", "its month field '13' is not valid"),
        ("0 0 * * 8", "its day-of-week field '8' is not valid"),
        ("* * 31 2 *", "never fires: no month it names has the day"),
        ("0 0 30,31 2 *", "never fires"),
        ("0 0 31 4,6,9,11 *", "never fires"),
        ("*/61 * * * *", "minute field, '\\*/61' steps by 61 over 0-59, so it matches 0 alone"),
        ("0 */24 * * *", "hour field, '\\*/24' steps by 24 over 0-23"),
        ("0 10-12/5 * * *", "'10-12/5' steps by 5 over 10-12, so it matches 10 alone"),
        ("* * * *", "has 4 fields; use 5"),
        ("* * * * * *", "has 6 fields; use 5"),
        ("", "non-empty str"),
        ("every minute", "has 2 fields"),
    ],
)
def test_bad_cron_expressions_are_refused_with_the_value(expression, message):
    with pytest.raises(ValueError, match=message):
        validate_cron(expression)


@pytest.mark.parametrize(
    "expression",
    ["0 0 29 2 *", "0 0 31 2 1", "*/59 * * * *", "5/20 * * * *", "0 0 L * *", "0 9 * * 1#2"],
)
def test_rare_but_real_cron_expressions_are_accepted(expression):
    assert validate_cron(expression) == expression


# -- the scheduler, with an injected clock ----------------------------------------------------


def test_each_occurrence_is_dispatched_once_however_many_schedulers_look():
    schedule = make_schedule()
    assert schedule.next_run_at == T0 + timedelta(minutes=5)
    clock = Clock(T0 + timedelta(minutes=4))
    first, second = Scheduler(clock=clock), Scheduler(clock=clock)

    first.tick()
    assert not Job.objects.exists()

    clock.now = T0 + timedelta(minutes=5, seconds=1)
    first.tick()
    second.tick()
    first.tick()
    assert Job.objects.filter(name=Noop.name).count() == 1
    run = ScheduledRun.objects.get()
    assert run.occurrence_at == T0 + timedelta(minutes=5)
    assert run.job_id == Job.objects.get().pk
    schedule.refresh_from_db()
    assert schedule.last_run_at == T0 + timedelta(minutes=5)
    assert schedule.next_run_at == T0 + timedelta(minutes=10)


def test_a_stale_scheduler_loses_the_race_for_an_occurrence():
    schedule = make_schedule()
    clock = Clock(T0 + timedelta(minutes=5))
    stale = Schedule.objects.get(pk=schedule.pk)  # read before the other worker's tick
    Scheduler(clock=clock).tick()
    assert Scheduler(clock=clock).handle(stale, clock.now) == []
    assert Job.objects.count() == 1


@pytest.mark.parametrize(
    ("misfire", "limit", "expected"),
    [
        # Down from 09:00 to 10:02: the 12 occurrences 09:05 ... 10:00 are all missed.
        ("skip", 100, []),
        ("once", 100, [60]),
        ("catch_up", 100, list(range(5, 65, 5))),
        ("catch_up", 3, [50, 55, 60]),
    ],
)
def test_misfire_policies_after_a_downtime(misfire, limit, expected):
    schedule = make_schedule(misfire=misfire, catch_up_limit=limit)
    Scheduler(clock=Clock(T0 + timedelta(minutes=62))).tick()

    minutes = sorted(
        int((run.occurrence_at - T0).total_seconds() // 60)
        for run in ScheduledRun.objects.filter(job_id__isnull=False)
    )
    assert minutes == expected
    assert Job.objects.count() == len(expected)
    schedule.refresh_from_db()
    assert schedule.last_run_at == T0 + timedelta(minutes=60)
    assert schedule.next_run_at == T0 + timedelta(minutes=65)


def test_skip_still_runs_an_occurrence_within_the_grace_period():
    make_schedule(misfire="skip")
    Scheduler(clock=Clock(T0 + timedelta(minutes=60, seconds=30))).tick()
    assert [r.occurrence_at for r in ScheduledRun.objects.all()] == [T0 + timedelta(minutes=60)]


def test_overlap_false_skips_while_the_previous_run_is_unfinished():
    schedule = make_schedule(overlap=False)
    clock = Clock(T0 + timedelta(minutes=5))
    scheduler = Scheduler(clock=clock)
    scheduler.tick()
    first = Job.objects.get()

    clock.now = T0 + timedelta(minutes=10)
    scheduler.tick()  # first is still waiting
    assert Job.objects.count() == 1
    assert ScheduledRun.objects.get(occurrence_at=clock.now).skipped

    Job.objects.filter(pk=first.pk).update(state=JobState.SUCCEEDED)
    clock.now = T0 + timedelta(minutes=15)
    scheduler.tick()
    assert Job.objects.count() == 2
    schedule.refresh_from_db()
    assert schedule.last_job_id == Job.objects.order_by("-id").first().pk

    # With overlap allowed (the default) the same situation dispatches.
    schedule.overlap = True
    schedule.save()
    clock.now = T0 + timedelta(minutes=20)
    scheduler.tick()
    assert Job.objects.count() == 3


def test_an_edited_schedule_takes_effect_at_the_next_tick():
    schedule = make_schedule()
    clock = Clock(T0 + timedelta(minutes=5))
    scheduler = Scheduler(clock=clock)
    scheduler.tick()

    schedule.refresh_from_db()
    schedule.cron = "0 * * * *"  # hourly from now on
    schedule.save()
    assert schedule.next_run_at > T0 + timedelta(minutes=10)
    clock.now = T0 + timedelta(minutes=10)
    scheduler.tick()
    assert Job.objects.count() == 1  # the old */5 timing is gone

    schedule.enabled = False
    schedule.save()
    clock.now = schedule.next_run_at + timedelta(seconds=1)
    scheduler.tick()
    assert Job.objects.count() == 1


def test_an_idle_look_is_one_statement_and_a_due_schedule_still_runs():
    """With the database's clock (the default), a look that finds nothing due costs one
    statement (now and the earliest next run together); a schedule that comes due is
    dispatched by the next look."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from django_gator.engines import get_engine

    db_now = get_engine("default").db_now()
    schedule = make_schedule(anchor_at=db_now)
    scheduler = Scheduler()
    scheduler.tick()  # the first look also prunes old ScheduledRun rows
    with CaptureQueriesContext(connection) as looks:
        upcoming = scheduler.tick()
    assert len(looks) == 1, [q["sql"] for q in looks]
    assert upcoming == schedule.next_run_at
    assert not Job.objects.exists()

    Schedule.objects.filter(pk=schedule.pk).update(
        next_run_at=db_now - timedelta(seconds=1), anchor_at=db_now - timedelta(minutes=5)
    )
    with CaptureQueriesContext(connection) as looks:
        upcoming = scheduler.tick()
    assert len(looks) > 1
    assert Job.objects.filter(name=Noop.name).count() == 1
    assert upcoming is not None
    assert upcoming > db_now

    Schedule.objects.update(enabled=False)
    with CaptureQueriesContext(connection) as looks:
        assert scheduler.tick() is None
    assert len(looks) == 1


def test_schedule_arguments_queue_and_priority_reach_the_job():
    Schedule(
        name="report",
        job_name=Record.name,
        cron="*/5 * * * *",
        kwargs={"label": "nightly"},
        queue="reports",
        priority=9,
        anchor_at=T0,
    ).save()
    Scheduler(clock=Clock(T0 + timedelta(minutes=5))).tick()
    job = Job.objects.get()
    assert (job.kwargs, job.queue, job.priority) == ({"label": "nightly"}, "reports", 9)


# -- declared schedules -----------------------------------------------------------------------


@pytest.fixture
def scheduled_class() -> Iterator[type[Queueable]]:
    class Nightly(Queueable):
        name = "tests.Nightly"
        schedule = [
            Cron("0 3 * * *", timezone="Europe/Berlin", kwargs={"label": "x"}),
            "*/10 * * * *",
        ]

        def handle(self, label: str = "") -> None:
            return None

    yield Nightly
    unregister("tests.Nightly")


def test_schedules_declared_in_code_and_settings_are_written_and_kept_in_step(scheduled_class):
    settings_schedules = {
        "cleanup": {"job": Noop.name, "cron": "15 * * * *", "misfire": "skip"},
    }
    with override_settings(GATOR_SCHEDULES=settings_schedules):
        Scheduler(clock=Clock(T0)).sync_declared()
    rows = {s.name: s for s in Schedule.objects.all()}
    assert set(rows) == {"tests.Nightly", "tests.Nightly#2", "cleanup"}
    assert rows["tests.Nightly"].timezone == "Europe/Berlin"
    assert rows["tests.Nightly"].kwargs == {"label": "x"}
    assert rows["tests.Nightly"].source == ScheduleSource.CODE
    assert (rows["cleanup"].misfire, rows["cleanup"].source) == ("skip", ScheduleSource.SETTINGS)

    # Changed in settings, then removed: updated, then disabled.
    with override_settings(GATOR_SCHEDULES={"cleanup": {"job": Noop.name, "cron": "45 * * * *"}}):
        Scheduler(clock=Clock(T0)).sync_declared()
    assert Schedule.objects.get(name="cleanup").cron == "45 * * * *"
    with override_settings(GATOR_SCHEDULES={}):
        Scheduler(clock=Clock(T0)).sync_declared()
    assert not Schedule.objects.get(name="cleanup").enabled
    assert Schedule.objects.get(name="tests.Nightly").enabled


@pytest.mark.parametrize(
    ("entry", "field", "message"),
    [
        ({"job": Noop.name, "cron": "* * *"}, "cron", "has 3 fields"),
        ({"job": "tests.NoSuchJob", "cron": "* * * * *"}, "job", "is not registered"),
        (
            {"job": Noop.name, "cron": "* * * * *", "timezone": "Mars/Olympus"},
            "timezone",
            "unknown",
        ),
        ({"job": Record.name, "cron": "* * * * *", "kwargs": {"nope": 1}}, "args", "do not fit"),
        ({"job": Noop.name, "cron": "* * * * *", "misfire": "later"}, "misfire", "not one of"),
        ({"job": Noop.name, "cron": "* * * * *", "every": 5}, "every", "unknown key"),
    ],
)
def test_bad_declared_schedules_are_refused_naming_schedule_and_field(entry, field, message):
    with override_settings(GATOR_SCHEDULES={"broken": entry}):
        with pytest.raises(ImproperlyConfigured) as info:
            Scheduler(clock=Clock(T0)).sync_declared()
        assert f"schedule 'broken', field '{field}'" in str(info.value)
        assert message in str(info.value)
        errors = [e for e in checks.run_checks() if e.id == "django_gator.E005"]
        assert len(errors) == 1
        assert f"field '{field}'" in errors[0].msg


# -- the admin form -------------------------------------------------------------------------


def form(**data: object) -> ScheduleForm:
    fields = {
        "name": "s",
        "job_name": Noop.name,
        "cron": "*/5 * * * *",
        "timezone": "UTC",
        "args": "[]",
        "kwargs": "{}",
        "queue": "",
        "priority": "",
        "enabled": "on",
        "misfire": "once",
        "catch_up_limit": "100",
        "overlap": "on",
    }
    fields.update({k: str(v) for k, v in data.items()})
    return ScheduleForm(data=fields)


def test_the_admin_form_accepts_a_good_schedule_and_shows_its_next_run():
    f = form()
    assert f.is_valid(), f.errors
    schedule = f.save()
    assert schedule.next_run_at is not None
    assert schedule.source == ScheduleSource.ADMIN


@pytest.mark.parametrize(
    ("data", "field", "message"),
    [
        ({"cron": "61 * * * *"}, "cron", "not a valid cron expression"),
        ({"timezone": "Europe/Nowhere"}, "timezone", "unknown time zone 'Europe/Nowhere'"),
        ({"job_name": "os.system"}, "job_name", "Select a valid choice"),
        ({"job_name": Record.name, "kwargs": '{"bad": 1}'}, "args", "do not fit handle()"),
        ({"args": "{}"}, "args", "must be a JSON list"),
        ({"queue": "no spaces"}, "queue", "invalid queue name"),
    ],
)
def test_the_admin_form_names_the_bad_field(data, field, message):
    f = form(**data)
    assert not f.is_valid()
    assert message in " ".join(f.errors[field]), f.errors


# -- three worker processes, 200 simulated minutes --------------------------------------------


def test_three_workers_dispatch_each_occurrence_exactly_once(spawn_worker, tmp_path):
    clock_file = tmp_path / "clock"
    set_file_clock(clock_file, T0)
    Schedule(
        name="every-minute",
        job_name=Noop.name,
        cron="* * * * *",
        misfire="catch_up",
        catch_up_limit=1000,
        anchor_at=T0,
    ).save()
    env = {"GATOR_TEST_CLOCK_FILE": str(clock_file), "GATOR_SCHEDULER_INTERVAL": "0.02"}
    workers = [spawn_worker("--concurrency", "1", env=env) for _ in range(3)]

    minutes = 200
    for minute in range(1, minutes + 1):
        set_file_clock(clock_file, T0 + timedelta(minutes=minute, seconds=1))
        time.sleep(0.03)  # deliberate: the simulated clock runs at 2000 times real time
    try:
        wait_for(
            lambda: Schedule.objects.get().last_run_at == T0 + timedelta(minutes=minutes),
            timeout=120,
        )
    except AssertionError:
        schedule = Schedule.objects.get()
        logs = "\n".join(worker_output(w)[-3000:] for w in workers)
        raise AssertionError(
            f"last_run_at={schedule.last_run_at} runs={ScheduledRun.objects.count()}\n{logs}"
        ) from None
    for worker in workers:
        worker.send_signal(signal.SIGTERM)
    for worker in workers:
        assert worker.wait(timeout=30) == 0, worker_output(worker)

    runs = list(ScheduledRun.objects.order_by("occurrence_at"))
    assert [r.occurrence_at for r in runs] == [
        T0 + timedelta(minutes=m) for m in range(1, minutes + 1)
    ]
    assert not any(r.skipped for r in runs)
    job_ids = [r.job_id for r in runs]
    assert len(set(job_ids)) == minutes
    assert Job.objects.filter(name=Noop.name).count() == minutes
    assert set(Job.objects.values_list("pk", flat=True)) == set(job_ids)


def test_a_schedule_for_a_job_this_worker_does_not_know_is_left_alone(caplog):
    schedule = make_schedule()
    Schedule.objects.filter(pk=schedule.pk).update(job_name="tests.FromNewerCode")
    clock = Clock(T0 + timedelta(minutes=5))
    scheduler = Scheduler(clock=clock)
    scheduler.tick()
    scheduler.tick()

    assert not Job.objects.exists()
    schedule.refresh_from_db()
    assert schedule.last_run_at is None  # a worker that knows the job will still run it
    logged = [r for r in caplog.records if "not registered in this worker" in r.getMessage()]
    assert len(logged) == 1
