"""The dashboard's throughput chart, drawn by a template."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from datetime import timezone as fixed_offset

from django.test import override_settings
from django.utils import timezone, translation

from django_gator.admin.chart import chart_svg


def texts(svg: str, group: str) -> list[str]:
    """The texts of the chart's ``<g class="group">`` (which holds no other group)."""
    match = re.search(rf'<g class="{group}".*?</g>', svg, re.S)
    assert match, svg
    return re.findall(r"<text[^>]*>([^<]*)</text>", match.group(0))


def test_the_throughput_chart_has_a_legend_and_labelled_time_and_count_axes():
    start = datetime(2026, 5, 1, 12, 1, tzinfo=UTC)
    points = [
        {"minute": start + timedelta(minutes=i), "succeeded": i % 7, "dead": int(i == 30)}
        for i in range(60)
    ]
    svg = chart_svg(points)

    legend = re.search(r'<g class="gator-legend".*?</g>', svg, re.S)
    assert legend
    assert texts(svg, "gator-legend") == ["succeeded", "dead"]
    assert 'fill="#3a8c3a"' in legend.group(0)
    assert 'fill="#c0392b"' in legend.group(0)
    assert texts(svg, "gator-x-axis") == [
        "12:10",
        "12:20",
        "12:30",
        "12:40",
        "12:50",
        "13:00",
        "time (UTC)",
    ]
    assert texts(svg, "gator-y-axis") == ["0", "3", "6", "jobs/min"]
    # In the admin's time zone, as the job pages show times.
    timezone.activate("Asia/Kolkata")  # UTC+05:30
    try:
        shifted = chart_svg(points)
    finally:
        timezone.deactivate()
    assert ">17:40<" in shifted
    assert ">time (IST)<" in shifted


def test_the_chart_escapes_its_text_and_never_localizes_its_numbers():
    """The template escapes what it draws (here a time zone's name), and its coordinates
    and counts stay plain numbers in a locale with a decimal comma and thousands groups."""
    start = datetime(2026, 5, 1, 12, 1, tzinfo=UTC)
    points = [
        {"minute": start + timedelta(minutes=i), "succeeded": 1000 + 37 * i, "dead": i % 3}
        for i in range(60)
    ]
    zone = fixed_offset(timedelta(hours=1), "<b>Z</b>")
    with (
        override_settings(USE_THOUSAND_SEPARATOR=True),
        translation.override("de"),
        timezone.override(zone),
    ):
        svg = chart_svg(points)

    assert "<b>" not in svg
    assert ">time (&lt;b&gt;Z&lt;/b&gt;)</text>" in svg
    assert texts(svg, "gator-y-axis") == ["0", "1592", "3185", "jobs/min"]
    numbers = re.findall(r' (?:x|y|x1|y1|x2|y2|width|height)="([^"]*)"', svg)
    assert len(numbers) > 200
    assert all(re.fullmatch(r"-?\d+(\.\d)?", n) for n in numbers), numbers
    assert "<title>13:01: 1000 succeeded, 0 dead</title>" in svg
