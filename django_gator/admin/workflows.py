"""The workflow page: the graph of a workflow's steps, each with its state, drawn as an SVG
by a template (``admin/django_gator/workflowrun/graph.svg``, autoescaped, no script, no
external file), and the table of its steps with their jobs and why any was cancelled.

Steps are laid out in columns by depth (a step sits one column right of the deepest step it
waits for), so every arrow points right. A batch step is drawn as a stack of boxes that
says how many of its members succeeded, and links to its batch's page.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin
from django.db.models import Count
from django.http import HttpRequest
from django.template.loader import render_to_string
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from django_gator import redaction
from django_gator.admin.display import time_field
from django_gator.admin.waits import WaitDecisionView, operations, waits_table
from django_gator.models import Job, WorkflowRun, WorkflowStep
from django_gator.states import JobState, StepState

TEMPLATE = "admin/django_gator/workflowrun/graph.svg"
#: A step's colour by what it shows (its job's state once released).
COLOURS = {
    StepState.BLOCKED.value: "#8a8a8a",
    JobState.WAITING.value: "#d4a017",
    JobState.RUNNING.value: "#2f6fb0",
    JobState.FAILED.value: "#e67e22",
    JobState.SUCCEEDED.value: "#3a8c3a",
    JobState.DEAD.value: "#c0392b",
    JobState.CANCELLED.value: "#6b6b6b",
}
NODE_W, NODE_H, GAP_X, GAP_Y, MARGIN = 170, 38, 50, 14, 8


def shown_state(
    step: WorkflowStep, jobs: dict[int, str], members: dict[int, dict[str, int]] | None = None
) -> str:
    """What a step's box says: its job's state once released (waiting, running, failed
    ...), else the step's own (blocked, cancelled). A released batch step says running
    while a member runs, else failed or waiting while one is."""
    if step.state == StepState.RELEASED and step.job_id in jobs:
        return jobs[step.job_id]
    counts = (members or {}).get(step.batch_id or 0)
    if step.state == StepState.RELEASED and counts:
        for state in (JobState.RUNNING, JobState.FAILED, JobState.WAITING):
            if counts.get(state):
                return state.value
    return str(step.state)


def member_counts(alias: str | None, steps: list[WorkflowStep]) -> dict[int, dict[str, int]]:
    """Batch id -> its members' count by state, for the released batch steps among
    ``steps`` (one grouped read of the batch index)."""
    ids = [s.batch_id for s in steps if s.batch_id is not None]
    out: dict[int, dict[str, int]] = {batch_id: {} for batch_id in ids}
    rows = (
        Job.objects.using(alias)
        .filter(batch_id__in=ids)
        .order_by()
        .values_list("batch_id", "state")
        .annotate(n=Count("id"))
    )
    for batch_id, state, n in rows:
        out[batch_id][state] = n
    return out


def batch_summary(step: WorkflowStep, members: dict[int, dict[str, int]]) -> str:
    """``12/40 succeeded`` for a released batch step, ``40 members`` before."""
    if step.batch_id is None:
        return f"{len(step.members or [])} members"
    counts = members.get(step.batch_id, {})
    return f"{counts.get(JobState.SUCCEEDED, 0)}/{sum(counts.values())} succeeded"


def graph_context(run: WorkflowRun, site: str = "admin") -> dict[str, Any]:
    """The layout of ``run``'s graph for the template."""
    steps = list(WorkflowStep.objects.using(run._state.db).filter(workflow=run))
    ids = [s.job_id for s in steps if s.job_id is not None]
    jobs = dict(Job.objects.using(run._state.db).filter(pk__in=ids).values_list("pk", "state"))
    members = member_counts(run._state.db, steps)
    depth, rows, place = _layout(steps)
    nodes = [_node(step, place[step.position], jobs, members, site) for step in steps]
    columns = max(depth.values(), default=0) + 1
    return {
        "nodes": nodes,
        "edges": _edges(steps, place),
        "node_w": NODE_W,
        "node_h": NODE_H,
        "width": 2 * MARGIN + columns * NODE_W + (columns - 1) * GAP_X,
        "height": 2 * MARGIN + max(rows.values(), default=1) * (NODE_H + GAP_Y) - GAP_Y,
    }


def _layout(
    steps: list[WorkflowStep],
) -> tuple[dict[int, int], dict[int, int], dict[int, tuple[float, float]]]:
    """Each step's column (its depth: one more than its deepest dependency), the number of
    rows per column, and each step's place (x, y), by position."""
    depth: dict[int, int] = {}
    for step in sorted(steps, key=lambda s: s.position):  # dependencies come first
        depth[step.position] = 1 + max((depth.get(p, 0) for p in step.after), default=-1)
    rows: dict[int, int] = {}
    place: dict[int, tuple[float, float]] = {}
    for step in sorted(steps, key=lambda s: (depth[s.position], s.position)):
        column = depth[step.position]
        row = rows.get(column, 0)
        rows[column] = row + 1
        place[step.position] = (
            MARGIN + column * (NODE_W + GAP_X),
            MARGIN + row * (NODE_H + GAP_Y),
        )
    return depth, rows, place


def _node(
    step: WorkflowStep,
    at: tuple[float, float],
    jobs: dict[int, str],
    members: dict[int, dict[str, int]],
    site: str,
) -> dict[str, Any]:
    """One step's box: its place, label, state, colour, tooltip and link."""
    x, y = at
    state = shown_state(step, jobs, members)
    named = step.label and step.label != str(step.position)
    short = step.label if named else step.name.rsplit(".", 1)[-1]
    where = f"step {step.position}" + (f" {step.label!r}" if named else "")
    title = f"{where}: {step.name} ({state})"
    summary = ""
    url = ""
    if step.job_id is not None:
        url = reverse(f"{site}:django_gator_job_change", args=[step.job_id])
    if step.is_batch:
        summary = batch_summary(step, members)
        title = f"{where}: batch of {step.name} ({state}, {summary})"
        if step.batch_id is not None:
            counts = members.get(step.batch_id, {})
            title += "; " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
            url = reverse(f"{site}:django_gator_job_batch", args=[step.batch_id])
    if step.reason:
        title += f"; {step.reason}"
    return {
        "position": step.position,
        "label": short if len(short) <= 20 else short[:19] + "…",
        "state": state,
        "summary": summary,
        "batch": step.is_batch,
        "title": title,
        "colour": COLOURS.get(state, "#8a8a8a"),
        "dashed": step.state == StepState.BLOCKED,
        "x": x,
        "y": y,
        "back_x": x + 4,  # a batch step's stack: the box behind
        "back_y": y - 4,
        "text_x": x + 8,
        "line1_y": y + 15,
        "line2_y": y + 30,
        "url": url,
    }


def _edges(
    steps: list[WorkflowStep], place: dict[int, tuple[float, float]]
) -> list[dict[str, float]]:
    """An arrow from each dependency's box to its dependent's."""
    edges = []
    for step in steps:
        x2, y2 = place[step.position]
        for parent in step.after:
            x1, y1 = place[parent]
            start, end = x1 + NODE_W, x2
            edges.append(
                {
                    "x1": start,
                    "y1": y1 + NODE_H / 2,
                    "x2": end,
                    "y2": y2 + NODE_H / 2,
                    "cx": (start + end) / 2,
                }
            )
    return edges


def render_graph(run: WorkflowRun, site: str = "admin") -> str:
    return render_to_string(TEMPLATE, graph_context(run, site))


class WorkflowRunAdmin(admin.ModelAdmin):
    """Workflows, read-only: the list, and each one's graph and steps."""

    list_display = ("name_or_id", "created", "step_count")
    search_fields = ("name", "=id")
    fields = readonly_fields = (
        "id",
        "name",
        "on_error",
        "created",
        "graph",
        "steps_table",
    )

    def get_urls(self) -> list[URLPattern]:
        decide = path(
            "<uuid:run_id>/decide/",
            self.admin_site.admin_view(WaitDecisionView.as_view(model_admin=self)),
            name="django_gator_workflowrun_decide",
        )
        return [decide, *super().get_urls()]

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> Any:
        """The page, with its wait steps below the fields (and, for a user who may decide,
        their Approve and Reject buttons): see admin/waits.py."""
        run = self.get_object(request, object_id)
        context = dict(extra_context or {})
        if run is not None:
            context["gator_waits"] = waits_table(run, request, self.admin_site.name)
            context["gator_operations"] = operations(run, request, self.admin_site.name)
        return super().change_view(request, object_id, form_url, context)

    created = time_field("created_at", "created at")

    @admin.display(description="workflow")
    def name_or_id(self, run: WorkflowRun) -> str:
        return str(run)

    @admin.display(description="steps")
    def step_count(self, run: WorkflowRun) -> int:
        return run.steps.count()

    @admin.display(description="graph")
    def graph(self, run: WorkflowRun) -> SafeString:
        return format_html(
            '<div class="gator-workflow-graph" style="overflow-x:auto">{}</div>',
            SafeString(render_graph(run, self.admin_site.name)),
        )

    @admin.display(description="steps")
    def steps_table(self, run: WorkflowRun) -> SafeString:
        steps = list(run.steps.all())
        ids = [s.job_id for s in steps if s.job_id is not None]
        found = Job.objects.filter(pk__in=ids).values_list("pk", "state", "result")
        jobs = {pk: state for pk, state, _ in found}
        results = {pk: result for pk, _, result in found}
        members = member_counts(None, steps)
        site = self.admin_site.name
        rows = format_html_join(
            "\n",
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
            "<td><code>{}</code></td></tr>",
            (
                (
                    _step_cell(step),
                    step.name,
                    ", ".join(map(str, step.after)) or "-",
                    shown_state(step, jobs, members),
                    _job_cell(step, members, site),
                    step.reason or "-",
                    _result_cell(step, results),
                )
                for step in steps
            ),
        )
        return format_html(
            '<table class="gator-workflow-steps"><thead><tr><th>step</th><th>job name</th>'
            "<th>after</th><th>state</th><th>job</th><th>why cancelled</th><th>result</th>"
            "</tr></thead><tbody>{}</tbody></table>",
            rows,
        )

    # Rows are written by dispatch and the workers only.
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


def _step_cell(step: WorkflowStep) -> str:
    """A step's position, and its name if it has one."""
    named = step.label and step.label != str(step.position)
    return f"{step.position} ({step.label})" if named else str(step.position)


def _result_cell(step: WorkflowStep, results: dict[int, Any]) -> str:
    """A step's result as its dependents read it (redacted like arguments: keys of
    GATOR_REDACT and the job class's ``redact``), cut short for the table."""
    if step.job_id is None or results.get(step.job_id) is None:
        return "-"
    keys = redaction.keys_for(step.name)
    shown = json.dumps(redaction.redact_value(results[step.job_id], keys), ensure_ascii=False)
    return shown if len(shown) <= 200 else shown[:199] + "…"


def _job_cell(step: WorkflowStep, members: dict[int, dict[str, int]], site: str) -> Any:
    """The steps table's job column: the step's job, or its batch and how far it is."""
    if step.job_id is not None:
        return format_html(
            '<a href="{}">{}</a>',
            reverse(f"{site}:django_gator_job_change", args=[step.job_id]),
            step.job_id,
        )
    if step.batch_id is not None:
        return format_html(
            '<a href="{}">batch #{}</a> ({})',
            reverse(f"{site}:django_gator_job_batch", args=[step.batch_id]),
            step.batch_id,
            batch_summary(step, members),
        )
    if step.is_batch:
        return f"batch of {batch_summary(step, members)}"
    return "-"


def step_of_batch(batch_id: int) -> WorkflowStep | None:
    """The workflow step whose batch is ``batch_id``, if any."""
    return WorkflowStep.objects.filter(batch_id=batch_id).select_related("workflow").first()


def workflow_link(job: Job, site: str = "admin") -> SafeString | str:
    """A link from a job's page to its workflow's, if it is a step of one."""
    if job.chain_id is None or not WorkflowRun.objects.filter(pk=job.chain_id).exists():
        return "-"
    return format_html(
        '<a href="{}">{}</a> (step {})',
        reverse(f"{site}:django_gator_workflowrun_change", args=[job.chain_id]),
        job.chain_id,
        job.chain_position,
    )
