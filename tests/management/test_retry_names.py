"""``gator_retry --name`` with a name no job has: refused with the close names, exit 2,
instead of "retried 0 jobs" and exit 0."""

from __future__ import annotations

import pytest

from django_gator.models import JobState
from tests.management.commandline import manage
from tests.management.test_commands import dead_job, refused, run

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_misspelt_name_is_refused_with_the_close_names():
    boom = dead_job(name="tests.testapp.jobs.Boom")

    message = refused("gator_retry", "--name", "tests.testapp.jobs.Bom")

    assert "--name 'tests.testapp.jobs.Bom': no job has this name" in message
    assert "did you mean 'tests.testapp.jobs.Boom'" in message
    assert "nothing was retried" in message
    assert boom.refresh_state() == JobState.DEAD


def test_a_name_far_from_every_other_is_refused_without_a_guess():
    message = refused("gator_retry", "--name", "billing.Unrelated")

    assert "no job has this name" in message
    assert "did you mean" not in message


def test_one_bad_name_among_good_ones_retries_nothing():
    boom = dead_job(name="tests.testapp.jobs.Boom")

    refused("gator_retry", "--name", "tests.testapp.jobs.Boom", "--name", "nope.Nothing")

    assert boom.refresh_state() == JobState.DEAD


def test_a_name_only_rows_still_hold_is_accepted():
    """A job class removed from the code leaves dead rows that may still be retried (onto
    a worker that knows the name again, or to be seen failing)."""
    gone = dead_job(name="billing.jobs.RemovedLastYear")

    out = run("gator_retry", "--name", "billing.jobs.RemovedLastYear")

    assert "retried 1 job" in out
    assert gone.refresh_state() == JobState.WAITING


def test_a_registered_name_with_no_dead_job_retries_nothing_and_succeeds():
    out = run("gator_retry", "--name", "tests.testapp.jobs.Noop")

    assert "retried 0 jobs" in out


def test_the_command_exits_non_zero_for_a_misspelt_name():
    done = manage("gator_retry", "--name", "tests.testapp.jobs.Ech")

    assert done.returncode == 2, done
    assert "did you mean 'tests.testapp.jobs.Echo'" in done.stderr
    assert "Traceback" not in done.stderr
