"""The documentation site (mkdocs.yml, docs/) documents what the code has: the reference
pages are generated from the sources (scripts/docs_reference.py), so these tests check that
the sources have what the pages are made of (a setting's meaning, a command's and each
option's help), that the pages carry the markers the generation fills, that the hand-written
pages name every permission and every public name, and that the README's and the pages'
relative links and images resolve. `make docs` builds it strictly (.ci/run)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import django_gator
from django_gator import conf
from scripts import docs_reference
from scripts.mkdocs_hooks import on_page_markdown

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README = ROOT / "README.md"
SETTINGS_PAGE = DOCS / "reference" / "settings.md"
COMMANDS_PAGE = DOCS / "reference" / "commands.md"
API_PAGE = DOCS / "reference" / "api.md"
PERMISSIONS_PAGE = DOCS / "reference" / "permissions.md"


def rendered(page: Path) -> str:
    """The page's Markdown as the site builds it (the generated parts filled in)."""
    return on_page_markdown(page.read_text(), None, None, None)


# -- settings ---------------------------------------------------------------------------------


def table_rows(text: str, header: str) -> list[tuple[str, ...]]:
    lines = text.splitlines()
    start = lines.index(header)
    width = header.count("|") - 1
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = tuple(cell.strip() for cell in line.strip().strip("|").split(" | "))
        assert len(cells) == width, line
        rows.append(cells)
    return rows


def test_the_settings_page_lists_exactly_the_declared_settings_with_their_defaults():
    rows = table_rows(rendered(SETTINGS_PAGE), docs_reference.SETTINGS_HEADER)
    assert [r[0] for r in rows] == [f"`{s.name}`" for s in conf.SETTINGS]
    assert [r[3] for r in rows] == [s.meaning for s in conf.SETTINGS]
    concurrency = rows[[s.name for s in conf.SETTINGS].index("GATOR_CONCURRENCY")]
    assert concurrency[1:3] == ("`4`", "whole number, at least 1")


@pytest.mark.parametrize("setting", conf.SETTINGS, ids=lambda s: s.name)
def test_every_setting_has_the_documentation_its_row_is_made_of(setting):
    assert setting.meaning.strip(), f"{setting.name} has no meaning in conf/table.py"
    assert len(setting.meaning.split()) >= 3, f"{setting.name}: {setting.meaning!r}"
    assert setting.rule.allowed().strip()


# -- management commands ----------------------------------------------------------------------

COMMANDS = docs_reference.command_docs()
OPTIONS = [
    pytest.param(command, option, id=f"{command} {option.flags}")
    for doc in COMMANDS
    for command, option in docs_reference.iter_options(doc)
]


def test_every_management_command_is_on_the_commands_page():
    names = [doc.name for doc in COMMANDS]
    assert "gator_worker" in names
    assert len(names) >= 9
    text = rendered(COMMANDS_PAGE)
    for doc in COMMANDS:
        assert f"\n## {doc.name}\n" in text
        assert doc.help, f"{doc.name} has no help text"


@pytest.mark.parametrize(("command", "option"), OPTIONS)
def test_every_command_option_has_help(command, option):
    assert len(option.help.split()) >= 2, f"{command} {option.flags} has no help text"


def test_a_missing_help_text_is_noticed():
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--documented", help="what it does (default %(default)s)", default=3)
    parser.add_argument("--bare")
    doc = docs_reference._document("x", parser)
    by_flag = {option.flags: option.help for option in doc.options}
    assert by_flag["`--documented DOCUMENTED`"] == "what it does (default 3)"
    assert by_flag["`--bare BARE`"] == ""


# -- the Python API and the permissions --------------------------------------------------------


def test_every_public_name_is_in_the_api_reference():
    text = API_PAGE.read_text()
    directives = set(re.findall(r"^::: ([\w.]+)$", text, re.MULTILINE))
    for name in django_gator.__all__:
        assert (
            f"django_gator.{name}" in directives
            or (
                name in {"GatorError", "JobCancelled", "JobNotRegistered"}
                and "django_gator.exceptions" in directives
            )
            or (name == "Batch" and "django_gator.models.batches.Batch" in directives)
        ), name


def test_the_permissions_page_names_every_permission_the_models_declare():
    text = PERMISSIONS_PAGE.read_text()
    declared = docs_reference.custom_permissions()
    assert len(declared) >= 6
    missing = [code for _, code, _ in declared if f"`django_gator.{code}`" not in text]
    assert missing == []


# -- links ------------------------------------------------------------------------------------

LINK = re.compile(r"\]\(([^)\s]+)\)")


def relative_links(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.DOTALL)
    return [
        link
        for link in LINK.findall(text)
        if not re.match(r"[a-z]+:", link) and not link.startswith("#")
    ]


@pytest.mark.parametrize("path", [README, *sorted(DOCS.rglob("*.md"))], ids=str)
def test_relative_links_and_images_resolve(path):
    missing = [
        link for link in relative_links(path) if not (path.parent / link.split("#", 1)[0]).exists()
    ]
    assert missing == [], f"{path.relative_to(ROOT)} links to what does not exist: {missing}"


def test_the_readme_shows_screenshots_that_exist_and_links_into_the_site():
    links = relative_links(README)
    screenshots = [link for link in links if link.startswith("docs/screenshots/")]
    assert len(screenshots) >= 2
    assert any(link.startswith("docs/reference/settings.md") for link in links)
    assert any(link.startswith("docs/tutorial/") for link in links)
    assert len(README.read_text().splitlines()) <= 260


# -- system checks ----------------------------------------------------------------------------


def test_every_system_check_the_package_raises_is_on_the_settings_page():
    raised = {
        match.group(1)
        for path in (ROOT / "django_gator").rglob("*.py")
        for match in re.finditer(r"\bid=f?\"django_gator\.([EW]\d{3})\"", path.read_text())
    }
    documented = [check_id for check_id, _ in docs_reference.system_checks()]
    assert len(raised) >= 15
    assert len(documented) == len(set(documented)), "a check listed twice"
    assert sorted(raised - set(documented)) == [], (
        "checks raised but not listed in django_gator/checks.py's docstring (the settings "
        "page's table is made from it)"
    )
    text = rendered(SETTINGS_PAGE)
    assert all(f"`django_gator.{check_id}`" in text for check_id in raised)


def test_unrendered_markdown_is_found_outside_code_only():
    from scripts.mkdocs_hooks import unrendered

    assert unrendered("<p>a <strong>b</strong> <a href='x'>c</a></p>") == []
    assert unrendered("<p>see <code>**kwargs</code></p><pre>x](y)</pre>") == []
    assert len(unrendered("<p>a **b and [c](d.md</p>")) == 2
    assert len(unrendered("<p><!-- gator:settings --></p>")) == 1


def test_the_signals_page_names_every_signal_of_the_package():
    from django.dispatch import Signal

    from django_gator import signals

    names = [name for name, value in vars(signals).items() if isinstance(value, Signal)]
    text = (DOCS / "reference" / "signals.md").read_text()
    assert len(names) >= 4
    assert [name for name in names if f"| `{name}` |" not in text] == []
