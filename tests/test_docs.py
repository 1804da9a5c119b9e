"""The docs say what the code does: docs/architecture.md's layer list is the contract that
`lint-imports` enforces (.importlinter), layer by layer, in the same order and syntax, and
the modules it points a reader at exist."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ARCHITECTURE = ROOT / "docs" / "architecture.md"
IMPORTLINTER = ROOT / ".importlinter"


def contract_layers(text: str) -> list[str]:
    """The ``layers =`` entries of .importlinter's layers contract, one string a layer."""
    section = text.split("[importlinter:contract:layers]", 1)[1].split("\n[", 1)[0]
    body = section.split("layers =", 1)[1]
    lines = [line.split("#", 1)[0].strip() for line in body.splitlines()]
    return [" ".join(line.split()) for line in lines if line]


def documented_layers(text: str) -> list[str]:
    """The layers of the fenced block under "## Layers": lines that start at the margin
    name a layer (a line ending with ``:`` or ``|`` goes on on the next one); indented
    lines describe it."""
    section = text.split("## Layers", 1)[1]
    block = section.split("```", 2)[1]
    layers: list[str] = []
    current = ""
    for line in block.splitlines():
        if not line.strip() or line.startswith((" ", "\t")):
            continue
        current = f"{current} {line.strip()}".strip()
        if not current.endswith((":", "|")):
            layers.append(" ".join(current.split()))
            current = ""
    assert not current, f"the layer list ends inside a layer: {current!r}"
    return layers


def test_the_architecture_docs_list_the_layers_of_the_import_contract():
    documented = documented_layers(ARCHITECTURE.read_text())
    contract = contract_layers(IMPORTLINTER.read_text())
    assert len(contract) > 10, "the contract's layers were not found"
    assert documented == contract, (
        "docs/architecture.md's Layers block differs from .importlinter's layers; it "
        "should list, top to bottom:\n" + "\n".join(contract)
    )


def test_the_modules_the_architecture_docs_name_exist():
    """Every `path.py` or `package/` the page names in backticks exists in the package (a
    bare file name, said of the package in the sentence, anywhere in it)."""
    text = ARCHITECTURE.read_text()
    package = ROOT / "django_gator"
    named = set(re.findall(r"`((?:[a-z_]+/)*[a-z_]+\.py|[a-z_]+/)`", text))
    assert len(named) > 20
    files = {path.name for path in package.rglob("*.py")}

    def exists(name: str) -> bool:
        if "/" not in name.rstrip("/"):
            return name in files or (package / name).exists() or (ROOT / name).exists()
        return (package / name).exists() or (ROOT / name).exists()

    missing = sorted(name for name in named if not exists(name))
    assert missing == [], f"docs/architecture.md names modules that do not exist: {missing}"


#: A Sphinx-style cross-reference to the package in a docstring or comment.
REFERENCE = re.compile(r":(?:class|func|mod|meth|data|attr|exc):`~?(django_gator(?:\.\w+)+)`")


def _resolves(reference: str) -> bool:
    import importlib

    parts = reference.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            target = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attribute in parts[cut:]:
                target = getattr(target, attribute)
        except AttributeError:
            return False
        return True
    return False


def test_cross_references_in_the_package_point_at_what_exists():
    """A docstring that says "see :class:`~django_gator.x.Y`" names a Y that x has (code
    moves; its references must move with it)."""
    references = {
        (str(path.relative_to(ROOT)), match.group(1))
        for path in (ROOT / "django_gator").rglob("*.py")
        for match in REFERENCE.finditer(path.read_text())
    }
    assert len(references) > 20
    broken = sorted(item for item in references if not _resolves(item[1]))
    assert broken == [], f"cross-references to nothing: {broken}"
