"""docs/ is for users and operators: no guide over 400 lines, and no link that leads nowhere.

Every page in docs/ (and docs/notes/) other than the two references, docs/api.md (the API) and
docs/privacy.md (the proofs), is at most ``MAX_GUIDE_LINES`` lines: dated experiments, rounds
and findings live in docs/notes/, one file per topic, linked from the guide where a reader
needs the why. Every relative markdown link in README.md, CONTRIBUTING.md and docs/**/*.md
points to a file or folder that exists, and a ``#fragment`` into a .md file names one of its
headings as GitHub slugs them (lowercase; punctuation but ``-`` and ``_`` dropped; spaces to
``-``; a repeated heading gets ``-1``, ``-2``, ...). Links inside code (fenced blocks and
inline spans) are text, not links, and are not checked.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
#: References, not guides: exempt from the length limit.
REFERENCES = {"api.md", "privacy.md"}
MAX_GUIDE_LINES = 400

FENCE = re.compile(r"^[ \t]*(```|~~~).*?^[ \t]*\1[ \t]*$", re.S | re.M)
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
LINK = re.compile(r"(?<!!)\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
IMAGE = re.compile(r"!\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)[ \t]*#*[ \t]*$", re.M)


def linked_files() -> list[Path]:
    """The files whose links are checked: README.md, CONTRIBUTING.md and docs/**/*.md."""
    return [REPO / "README.md", REPO / "CONTRIBUTING.md", *sorted(DOCS.rglob("*.md"))]


def guides() -> list[Path]:
    """Every page in docs/ (and below it) that is not one of the references."""
    return [
        p for p in sorted(DOCS.rglob("*.md")) if p.relative_to(DOCS).as_posix() not in REFERENCES
    ]


def _without_code(text: str) -> str:
    """The text with fenced blocks and inline code blanked (line numbers kept)."""
    text = FENCE.sub(lambda m: "\n" * m[0].count("\n"), text)
    return INLINE_CODE.sub(lambda m: " " * len(m[0]), text)


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading's text (before a repeat's ``-N`` suffix)."""
    text = re.sub(r"<[^>]+>", "", heading)  # inline HTML
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link's text stays
    text = text.lower()
    text = "".join(ch for ch in text if ch.isalnum() or ch in " -_")
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading anchor of a markdown text, repeats numbered as GitHub numbers them."""
    seen: dict[str, int] = {}
    found = set()
    for match in HEADING.finditer(FENCE.sub("", text)):
        slug = github_slug(match[2])
        count = seen.get(slug, 0)
        found.add(slug if count == 0 else f"{slug}-{count}")
        seen[slug] = count + 1
    return found


def broken_links(text: str, source: Path, root: Path = REPO) -> list[str]:
    """Each relative link of ``text`` (a file at ``source``) that leads nowhere, with why.

    A link with a scheme (``https:``, ``mailto:``) is outside this check; so is a link out of
    ``root``, which is reported as broken (a reader of the repository cannot follow it)."""
    problems = []
    plain = _without_code(text)
    targets = [m[1] for m in LINK.finditer(plain)] + [m[1] for m in IMAGE.finditer(plain)]
    for target in targets:
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):
            continue
        path, _, fragment = target.partition("#")
        file = (source.parent / path).resolve() if path else source.resolve()
        if not file.is_relative_to(root.resolve()):
            problems.append(f"{target}: outside the repository")
            continue
        if not file.exists():
            problems.append(f"{target}: no such file {file.relative_to(root.resolve())}")
            continue
        if fragment and file.suffix == ".md":
            heading_text = text if file == source.resolve() else file.read_text()
            if fragment not in anchors(heading_text):
                problems.append(f"{target}: no heading #{fragment} in {file.name}")
    return problems


#: Guides still over the limit while another change splits them: strict, so the entry must go
#: once the guide is short enough.
OVER_THE_LIMIT_FOR_NOW: dict[str, str] = {}


def _guide_param(path: Path) -> object:
    name = path.relative_to(DOCS).as_posix()
    if name in OVER_THE_LIMIT_FOR_NOW:
        return pytest.param(
            path, marks=pytest.mark.xfail(strict=True, reason=OVER_THE_LIMIT_FOR_NOW[name])
        )
    return path


def test_the_layout() -> None:
    assert (DOCS / "api.md").exists() and (DOCS / "privacy.md").exists()
    assert (DOCS / "notes").is_dir(), "dated experiments and findings live in docs/notes/"
    assert set(OVER_THE_LIMIT_FOR_NOW) <= {p.relative_to(DOCS).as_posix() for p in guides()}


@pytest.mark.parametrize(
    "path", [_guide_param(p) for p in guides()], ids=lambda p: str(p.relative_to(REPO))
)
def test_no_guide_is_over_the_limit(path: Path) -> None:
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_GUIDE_LINES, (
        f"{path.relative_to(REPO)}: {lines} lines, over {MAX_GUIDE_LINES}: move dated sections, "
        "rounds and findings to docs/notes/ (one file per topic, linked from the guide)"
    )


@pytest.mark.parametrize("path", linked_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_leads_somewhere(path: Path) -> None:
    assert broken_links(path.read_text(), path) == []


def test_every_note_is_linked_from_a_guide() -> None:
    """A note no page links to is lost: each is reachable from docs/ or the README."""
    linking = "".join(p.read_text() for p in linked_files() if p.parent != DOCS / "notes")
    for note in sorted((DOCS / "notes").glob("*.md")):
        assert f"notes/{note.name}" in linking, f"{note.name} is linked from no guide"


def test_the_checker_finds_a_planted_bad_link() -> None:
    """What the checker must catch, on texts planted beside the real docs."""
    source = DOCS / "ranking.md"
    good = (
        "## Sensitivity\n\nSee [privacy](privacy.md), [the sandbox](synthetic.md#the-sandbox), "
        "[below](#sensitivity), [the README](../README.md#more) and "
        "[a site](https://example.org/x.md#nowhere)."
    )
    assert broken_links(good, source) == []
    for bad, why in (
        ("[gone](no-such-page.md)", "no such file"),
        ("[gone](docs/ranking.md)", "no such file"),  # a path from the wrong folder
        ("[gone](synthetic.md#no-such-heading)", "no heading"),
        ("[gone](#no-such-heading)", "no heading"),
        ("[gone](../../outside.md)", "outside"),
    ):
        found = broken_links(f"Text and {bad}.\n", source)
        assert len(found) == 1 and why in found[0], (bad, found)
    # code is text: neither a fenced block's nor an inline span's link is a link
    assert broken_links("```md\n[x](nowhere.md)\n```\n`[y](nowhere.md)`\n", source) == []


def test_github_slugs() -> None:
    assert (
        github_slug("How to measure: `loadtest` and `soak`") == "how-to-measure-loadtest-and-soak"
    )
    assert github_slug("Synthesis as an admin job (`/v1/admin/synthetic`)") == (
        "synthesis-as-an-admin-job-v1adminsynthetic"
    )
    assert github_slug("6c. A synthetic release, charged") == "6c-a-synthetic-release-charged"
    assert (
        github_slug("email-Eu-core (1,005 nodes; 42 labels)")
        == "email-eu-core-1005-nodes-42-labels"
    )
    assert anchors("# A\n## A\n```sh\n# A\n```\n## A\n") == {"a", "a-1", "a-2"}
