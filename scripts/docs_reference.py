"""The generated parts of the documentation site: the settings table (from
django_gator/conf/table.py), the management commands' options (from their argparse parsers)
and the admin's permissions (from the models' Meta).

The site's pages hold a marker, ``<!-- gator:settings -->``, ``<!-- gator:checks -->`` (the
system checks, from django_gator/checks.py's docstring) or ``<!-- gator:commands -->``,
that scripts/mkdocs_hooks.py replaces with what this module writes, so the reference cannot
fall behind the code; tests/test_docs_site.py checks that the sources have the help text these
pages are made of, and that the hand-written permissions page names every permission.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import re
from collections.abc import Iterator
from dataclasses import dataclass

#: Options every Django management command has; documented by Django, not here.
DJANGO_OPTIONS = frozenset(
    {
        "help",
        "version",
        "verbosity",
        "settings",
        "pythonpath",
        "traceback",
        "no_color",
        "force_color",
        "skip_checks",
    }
)

#: Django's options in a usage line: ``[-h]``, ``[--settings SETTINGS]``, ``[-v {0,1,2,3}]``.
DJANGO_USAGE = re.compile(
    r"\[(?:-h|--version|-v \{0,1,2,3\}|--settings SETTINGS|--pythonpath PYTHONPATH"
    r"|--traceback|--no-color|--force-color|--skip-checks)\]"
)

SETTINGS_HEADER = "| setting | default | allowed | meaning |"


def setup_django() -> None:
    """Configure a minimal project (SQLite in memory) when none is configured, so that the
    commands' parsers and the models can be read without a settings module."""
    import django
    from django.conf import settings

    if not settings.configured:
        settings.configure(
            INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "django_gator"],
            DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
            USE_TZ=True,
            DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        )
    django.setup()


# -- settings -------------------------------------------------------------------------------


def settings_rows() -> list[tuple[str, str, str, str]]:
    """(setting, default, allowed, meaning) for every declared setting, in table order."""
    from django_gator import conf

    return [
        (
            f"`{s.name}`",
            s.shown_default() if s.shown else f"`{s.shown_default()}`",
            s.rule.allowed(),
            s.meaning,
        )
        for s in conf.SETTINGS
    ]


def settings_markdown() -> str:
    rows = ["| " + " | ".join(row) + " |" for row in settings_rows()]
    return "\n".join([SETTINGS_HEADER, "|---|---|---|---|", *rows])


# -- system checks ------------------------------------------------------------------------

CHECK_LINE = re.compile(r"^([EW]\d{3})  (.*)$")


def system_checks() -> list[tuple[str, str]]:
    """(id, meaning) of every system check that django_gator/checks.py's docstring lists:
    a line starting with the id, and the indented lines under it."""
    setup_django()
    from django_gator import checks

    found: list[tuple[str, str]] = []
    for line in (checks.__doc__ or "").splitlines():
        match = CHECK_LINE.match(line)
        if match:
            found.append((match.group(1), match.group(2).strip()))
        elif found and line.startswith("      ") and line.strip():
            check_id, text = found[-1]
            found[-1] = (check_id, f"{text} {line.strip()}")
    return found


def checks_markdown() -> str:
    order = sorted(system_checks(), key=lambda item: (item[0][0] == "W", item[0]))
    rows = [f"| `django_gator.{check_id}` | {_cell(text)} |" for check_id, text in order]
    return "\n".join(["| check | what it reports |", "|---|---|", *rows])


def _cell(text: str) -> str:
    """Text for a Markdown table cell: its pipes escaped, double backquotes made single."""
    return text.replace("|", "\\|").replace("``", "`")


# -- management commands --------------------------------------------------------------------


@dataclass(frozen=True)
class Option:
    """One documented option (or positional argument) of a command."""

    flags: str
    help: str


@dataclass(frozen=True)
class CommandDoc:
    name: str
    help: str
    usage: str
    options: tuple[Option, ...]
    subcommands: tuple[CommandDoc, ...] = ()


def command_names() -> list[str]:
    import django_gator.management.commands as package

    return sorted(info.name for info in pkgutil.iter_modules(package.__path__))


def _flags(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{action.metavar or action.dest}`"
    shown = []
    for flag in action.option_strings:
        if action.nargs == 0:
            shown.append(f"`{flag}`")
        else:
            metavar = action.metavar or action.dest.upper()
            if isinstance(metavar, tuple):
                metavar = " ".join(metavar)
            shown.append(f"`{flag} {metavar}`")
    return ", ".join(shown)


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    if not action.help or action.help == argparse.SUPPRESS:
        return ""
    formatter = parser._get_formatter()
    text = formatter._expand_help(action)  # %(default)s and the like
    return _cell(" ".join(text.split()))


def _document(name: str, parser: argparse.ArgumentParser) -> CommandDoc:
    options: list[Option] = []
    subcommands: list[CommandDoc] = []
    for action in parser._actions:
        if action.dest in DJANGO_OPTIONS or action.help == argparse.SUPPRESS:
            continue  # Django's own options, and internal ones hidden from --help
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for sub, subparser in action.choices.items():
                doc = _document(f"{name} {sub}", subparser)
                description = " ".join((subparser.description or helps.get(sub, "")).split())
                subcommands.append(
                    CommandDoc(doc.name, description, doc.usage, doc.options, doc.subcommands)
                )
            continue
        options.append(Option(_flags(action), _help(parser, action)))
    usage = " ".join(parser.format_usage().split()).removeprefix("usage: ")
    usage = " ".join(DJANGO_USAGE.sub("", usage).split())
    return CommandDoc(
        name,
        " ".join((parser.description or "").split()),
        usage,
        tuple(options),
        tuple(subcommands),
    )


def command_doc(name: str) -> CommandDoc:
    module = importlib.import_module(f"django_gator.management.commands.{name}")
    command = module.Command()
    parser = command.create_parser("manage.py", name)
    doc = _document(name, parser)
    return CommandDoc(name, " ".join(command.help.split()), doc.usage, doc.options, doc.subcommands)


def command_docs() -> list[CommandDoc]:
    setup_django()
    return [command_doc(name) for name in command_names()]


def iter_options(doc: CommandDoc) -> Iterator[tuple[str, Option]]:
    """Every option of a command and of its subcommands, with the command's name."""
    for option in doc.options:
        yield doc.name, option
    for sub in doc.subcommands:
        yield from iter_options(sub)


def _command_markdown(doc: CommandDoc, level: int) -> list[str]:
    lines = [f"{'#' * level} {doc.name}", ""]
    if doc.help:
        lines += [doc.help, ""]
    lines += ["```text", doc.usage, "```", ""]
    if doc.options:
        lines += ["| option | meaning |", "|---|---|"]
        lines += [f"| {option.flags} | {option.help} |" for option in doc.options]
        lines.append("")
    for sub in doc.subcommands:
        lines += _command_markdown(sub, level + 1)
    return lines


def commands_markdown() -> str:
    lines: list[str] = []
    for doc in command_docs():
        lines += _command_markdown(doc, 2)
    return "\n".join(lines).rstrip() + "\n"


# -- the admin's permissions ----------------------------------------------------------------


def custom_permissions() -> list[tuple[str, str, str]]:
    """(model, codename, name) of every permission django_gator's models declare."""
    setup_django()
    from django.apps import apps

    found = []
    for model in apps.get_app_config("django_gator").get_models():
        for codename, label in model._meta.permissions:
            found.append((model.__name__, codename, label))
    return found
