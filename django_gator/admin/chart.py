"""The dashboard's throughput chart: an SVG drawn by a template, with autoescaping.

This module only works out the geometry (bars, grid lines, axis labels) from the
per-minute counts; ``admin/django_gator/job/throughput_chart.svg`` draws it, so every
label passes through the template engine's escaping. No script, no external file: the admin
works offline. Text uses ``currentColor``, so it follows the admin's theme.
"""

from __future__ import annotations

from typing import Any

from django.template.loader import render_to_string
from django.utils import timezone

from django_gator.states import JobState

SUCCEEDED, DEAD = JobState.SUCCEEDED.value, JobState.DEAD.value

#: The chart's colours: succeeded and dead jobs.
CHART_COLOURS = {SUCCEEDED: "#3a8c3a", DEAD: "#c0392b"}
TEMPLATE = "admin/django_gator/job/throughput_chart.svg"


def _at(value: float) -> str:
    """A coordinate as the SVG gets it: one decimal, a dot, whatever the locale."""
    return f"{value:.1f}"


def chart_context(
    points: list[dict[str, Any]], width: int = 720, height: int = 210
) -> dict[str, Any]:
    """The geometry of the chart of ``points`` (``dashboard.throughput()``): stacked bars of
    succeeded (green) and dead (red) jobs per minute, a legend, a count axis (0, half, top)
    and a time axis labelled every 10 minutes in the admin's time zone."""
    top = max([p[SUCCEEDED] + p[DEAD] for p in points] + [1])
    left, right, head, foot = 48, 8, 26, 36
    plot_w, plot_h = width - left - right, height - head - foot
    base = head + plot_h
    bar_w = plot_w / max(len(points), 1)

    def y(value: float) -> float:
        return base - plot_h * value / top

    bars, ticks, zone = _bars(points, top, left, base, plot_h, bar_w)
    return {
        "width": width,
        "height": height,
        "minutes": len(points),
        "colours": CHART_COLOURS,
        "legend_x": width - right - 150,
        "left": left,
        "right": width - right,
        "head": head,
        "base": base,
        "count_label_x": left - 4,
        "grid": [
            {"y": _at(y(value)), "label_y": _at(y(value) + 4), "value": value}
            for value in sorted({0, round(top / 2), top})
        ],
        "bars": bars,
        "ticks": ticks,
        "tick_end": base + 4,
        "tick_label_y": base + 15,
        "time_label": f"time ({zone})" if zone else "time",
        "time_label_x": _at(left + plot_w / 2),
        "time_label_y": height - 4,
    }


def _bars(
    points: list[dict[str, Any]], top: int, left: int, base: int, plot_h: int, bar_w: float
) -> tuple[list[dict[str, Any]], list[dict[str, str]], str]:
    """One stacked bar per minute, a time tick every 10 minutes, and the name of the time
    zone the minutes are shown in."""
    bars = []
    ticks = []
    zone = ""
    for i, point in enumerate(points):
        minute = timezone.localtime(point["minute"])
        zone = minute.tzname() or ""
        ok_h = plot_h * point[SUCCEEDED] / top
        dead_h = plot_h * point[DEAD] / top
        rects = []  # succeeded at the bottom, dead stacked on them; none of height 0
        if ok_h:
            rects.append({"y": base - ok_h, "height": ok_h, "colour": CHART_COLOURS[SUCCEEDED]})
        if dead_h:
            rects.append(
                {"y": base - ok_h - dead_h, "height": dead_h, "colour": CHART_COLOURS[DEAD]}
            )
        bars.append(
            {
                "title": f"{minute:%H:%M}: {point[SUCCEEDED]} succeeded, {point[DEAD]} dead",
                "rects": [{**r, "y": _at(r["y"]), "height": _at(r["height"])} for r in rects],
                "x": _at(left + i * bar_w + 0.5),
                "width": _at(max(bar_w - 1, 1)),
            }
        )
        if minute.minute % 10 == 0:
            ticks.append({"x": _at(left + (i + 0.5) * bar_w), "label": f"{minute:%H:%M}"})
    return bars, ticks, zone


def chart_svg(points: list[dict[str, Any]], width: int = 720, height: int = 210) -> str:
    """The SVG of ``points`` (safe to put in a page: the template escaped what it drew)."""
    return render_to_string(TEMPLATE, chart_context(points, width, height))
