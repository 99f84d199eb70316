"""The documentation holds together.

* README.md is a front page: at most ``README_MAX_LINES`` lines, and it links every page under docs/ directly;
* no relative link in README.md or under docs/ is dead: every ``](path)`` that is not http(s) names a file or folder
  that exists relative to the page, and every ``#anchor`` names a heading of the page it points into;
* the table of rules in docs/policies.md is the one the policies' own metadata renders (``policies_table``);
* every folder under docs/results/ is listed (linked) in docs/results/README.md;
* every option of every subcommand is named in docs/cli.md, so a new option cannot go undocumented;
* every dotted ``disco.xxx`` name and every repository path (``disco/...``, ``scripts/...``) a docs page gives exists.

The rules' table is regenerated with ``python tests/unit/test_docs.py --write`` (it rewrites the part of
docs/policies.md between the markers); ``python tests/unit/test_docs.py`` prints it.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script: the repository's disco package
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_layout import resolves  # noqa: E402  (one resolver of dotted disco names for code, README and docs)

README = ROOT / "README.md"
DOCS = ROOT / "docs"
POLICIES_PAGE = DOCS / "policies.md"
CLI_PAGE = DOCS / "cli.md"
README_MAX_LINES = 250
TABLE_START = "<!-- policies table: generated -->"
TABLE_END = "<!-- end of policies table -->"
REGENERATE = "python tests/unit/test_docs.py --write"


# ---------------------------------------------------------------------------------------------
# the rules' table, from the policies' metadata


def _cell(text: str) -> str:
    """A Markdown table cell: one line, pipes escaped, a dash when empty."""
    text = " ".join(str(text or "").split()).replace("|", "\\|")
    return text or "—"


def policies_table() -> str:
    """One row per registered policy kind, in registration order: its kind, its grammar (``cls.template()``), what it
    does (``summary``) and where it comes from (``cite``)."""
    from disco.policies import policy_kinds

    lines = ["| kind | grammar | what it does | source |", "|---|---|---|---|"]
    for cls in policy_kinds():
        lines.append(f"| `{cls.kind}` | `{cls.template()}` | {_cell(cls.summary)} | {_cell(cls.cite)} |")
    return "\n".join(lines)


def page_table(text: str) -> str | None:
    """The table between the markers of docs/policies.md (None when a marker is missing)."""
    start, end = text.find(TABLE_START), text.find(TABLE_END)
    if start < 0 or end < start:
        return None
    return text[start + len(TABLE_START):end].strip()


def write_table(path: Path = POLICIES_PAGE) -> None:
    """Rewrite the generated table of ``path`` in place (between the markers)."""
    text = path.read_text(encoding="utf-8")
    start, end = text.find(TABLE_START), text.find(TABLE_END)
    if start < 0 or end < start:
        raise SystemExit(f"{path}: the markers {TABLE_START!r} and {TABLE_END!r} are missing")
    path.write_text(text[:start + len(TABLE_START)] + "\n" + policies_table() + "\n" + text[end:], encoding="utf-8")


# ---------------------------------------------------------------------------------------------
# Markdown: links and headings


FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$", re.M)


def prose(text: str) -> str:
    """The text without its fenced code blocks (a ``# comment`` in a shell block is no heading)."""
    return FENCE.sub("", text)


def links(text: str) -> list[str]:
    """Every link target of a page's prose (inline code and code blocks left out)."""
    return LINK.findall(INLINE_CODE.sub("", prose(text)))


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped (word characters, spaces and hyphens kept),
    spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading counts by its text
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found: dict[str, int] = {}
    out = set()
    for _, title in HEADING.findall(prose(path.read_text(encoding="utf-8"))):
        base = slug(title)
        n = found.get(base, 0)
        found[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def is_external(target: str) -> bool:
    return re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) is not None  # http:, https:, mailto:


def pages() -> list[Path]:
    """README.md and every Markdown page under docs/ (docs/results/README.md included)."""
    return [README, *sorted(DOCS.rglob("*.md"))]


def dead_links(page: Path) -> list[str]:
    dead = []
    for target in links(page.read_text(encoding="utf-8")):
        if is_external(target):
            continue
        path_part, _, anchor = target.partition("#")
        where = (page.parent / path_part).resolve() if path_part else page
        if not where.exists():
            dead.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
        elif anchor and where.suffix == ".md" and anchor not in anchors(where):
            dead.append(f"{page.relative_to(ROOT)}: {target} (no heading #{anchor} in {where.relative_to(ROOT)})")
    return dead


# ---------------------------------------------------------------------------------------------
# the tests


def test_readme_is_a_front_page():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines (at most {README_MAX_LINES}): move the detail to a page under docs/")
    assert lines[0] == "---", "README.md starts with the Hugging Face Space front matter"


def test_no_dead_relative_link():
    dead = [d for page in pages() for d in dead_links(page)]
    assert not dead, "dead links:\n" + "\n".join(dead)


def test_every_results_folder_is_listed():
    page = DOCS / "results" / "README.md"
    listed = {(page.parent / t.partition("#")[0]).resolve().parent for t in links(page.read_text(encoding="utf-8"))
              if not is_external(t) and t.partition("#")[0]}
    missing = [d.name for d in sorted((DOCS / "results").iterdir()) if d.is_dir() and d.resolve() not in listed]
    assert not missing, f"docs/results/README.md does not list {missing}: add a line and its meta.json command"


def test_every_docs_page_is_linked_from_the_readme():
    linked = set()
    for target in links(README.read_text(encoding="utf-8")):
        if not is_external(target) and target.partition("#")[0]:
            linked.add((ROOT / target.partition("#")[0]).resolve())
    missing = [p.relative_to(ROOT).as_posix() for p in sorted(DOCS.glob("*.md")) if p.resolve() not in linked]
    assert not missing, f"README.md links no page {missing}: link each from the README"


def test_the_policies_table_is_generated_from_the_policies():
    table = page_table(POLICIES_PAGE.read_text(encoding="utf-8"))
    assert table is not None, f"docs/policies.md lacks the markers {TABLE_START!r} ... {TABLE_END!r}"
    assert table == policies_table(), (
        f"docs/policies.md's table of rules is not the one the policies' metadata gives: run `{REGENERATE}` "
        "(or `python tests/unit/test_docs.py` to print it)")


def _options(parser: argparse.ArgumentParser, path: str):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _options(sub, f"{path} {name}")
        else:
            for option in action.option_strings:
                if option.startswith("--") and option != "--help":
                    yield path, option


def test_every_command_line_option_is_in_the_cli_page():
    from disco.cli import build_parser

    text = CLI_PAGE.read_text(encoding="utf-8")
    missing = sorted({f"{path} {option}" for path, option in _options(build_parser(), "python -m disco")
                      if not re.search(re.escape(option) + r"(?![\w-])", text)})
    assert not missing, "docs/cli.md does not name these options:\n" + "\n".join(missing)


DOTTED = re.compile(r"(?<![\w./-])disco(?:\.[A-Za-z_]\w*)+")
REPO_PATH = re.compile(r"`((?:disco|scripts|tests|assets|docs)/[\w./-]*[\w/])`")


def test_every_disco_name_and_path_in_the_docs_exists():
    stale = []
    for page in sorted(DOCS.rglob("*.md")):
        for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            where = f"{page.relative_to(ROOT)}:{n}"
            stale += [f"{where}: {m}" for m in DOTTED.findall(line) if not resolves(m)]
            stale += [f"{where}: {p}" for p in REPO_PATH.findall(line) if "*" not in p and not (ROOT / p).exists()]
    assert not stale, "names or paths that do not exist:\n" + "\n".join(stale)


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        write_table()
        print(f"rewrote the rules' table of {POLICIES_PAGE.relative_to(ROOT)}")
    else:
        print(policies_table())
