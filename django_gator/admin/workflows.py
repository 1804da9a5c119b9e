"""The workflow page: the graph of a workflow's steps, each with its state, drawn as an SVG
by a template (``admin/django_gator/workflowrun/graph.svg``, autoescaped, no script, no
external file), and the table of its steps with their jobs and why any was cancelled.

Steps are laid out in columns by depth (a step sits one column right of the deepest step it
waits for), so every arrow points right.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from django_gator.admin.display import time_field
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


def shown_state(step: WorkflowStep, jobs: dict[int, str]) -> str:
    """What a step's box says: its job's state once released (waiting, running, failed
    ...), else the step's own (blocked, cancelled)."""
    if step.state == StepState.RELEASED and step.job_id in jobs:
        return jobs[step.job_id]
    return str(step.state)


def graph_context(run: WorkflowRun, site: str = "admin") -> dict[str, Any]:
    """The layout of ``run``'s graph for the template."""
    steps = list(WorkflowStep.objects.using(run._state.db).filter(workflow=run))
    ids = [s.job_id for s in steps if s.job_id is not None]
    jobs = dict(Job.objects.using(run._state.db).filter(pk__in=ids).values_list("pk", "state"))
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
    nodes = []
    for step in steps:
        x, y = place[step.position]
        state = shown_state(step, jobs)
        short = step.name.rsplit(".", 1)[-1]
        title = f"step {step.position}: {step.name} ({state})"
        if step.reason:
            title += f"; {step.reason}"
        nodes.append(
            {
                "position": step.position,
                "label": short if len(short) <= 20 else short[:19] + "…",
                "state": state,
                "title": title,
                "colour": COLOURS.get(state, "#8a8a8a"),
                "dashed": step.state == StepState.BLOCKED,
                "x": x,
                "y": y,
                "text_x": x + 8,
                "line1_y": y + 15,
                "line2_y": y + 30,
                "url": reverse(f"{site}:django_gator_job_change", args=[step.job_id])
                if step.job_id is not None
                else "",
            }
        )
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
    columns = max(depth.values(), default=0) + 1
    return {
        "nodes": nodes,
        "edges": edges,
        "node_w": NODE_W,
        "node_h": NODE_H,
        "width": 2 * MARGIN + columns * NODE_W + (columns - 1) * GAP_X,
        "height": 2 * MARGIN + max(rows.values(), default=1) * (NODE_H + GAP_Y) - GAP_Y,
    }


def render_graph(run: WorkflowRun, site: str = "admin") -> str:
    return render_to_string(TEMPLATE, graph_context(run, site))


class WorkflowRunAdmin(admin.ModelAdmin):
    """Workflows, read-only: the list, and each one's graph and steps."""

    list_display = ("name_or_id", "created", "step_count")
    search_fields = ("name", "=id")
    fields = readonly_fields = ("id", "name", "on_error", "created", "graph", "steps_table")

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
        jobs = dict(Job.objects.filter(pk__in=ids).values_list("pk", "state"))
        site = self.admin_site.name
        rows = format_html_join(
            "\n",
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            (
                (
                    step.position,
                    step.name,
                    ", ".join(map(str, step.after)) or "-",
                    shown_state(step, jobs),
                    format_html(
                        '<a href="{}">{}</a>',
                        reverse(f"{site}:django_gator_job_change", args=[step.job_id]),
                        step.job_id,
                    )
                    if step.job_id is not None
                    else "-",
                    step.reason or "-",
                )
                for step in steps
            ),
        )
        return format_html(
            '<table class="gator-workflow-steps"><thead><tr><th>step</th><th>job name</th>'
            "<th>after</th><th>state</th><th>job</th><th>why cancelled</th></tr></thead>"
            "<tbody>{}</tbody></table>",
            rows,
        )

    # Rows are written by dispatch and the workers only.
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


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
