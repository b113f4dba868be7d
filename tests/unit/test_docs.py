"""The README and the documentation site stand alone and hold together.

`mkdocs build --strict` (ops/test) checks the links between the pages of docs/; this
checks what it does not see: the README (outside the site) links only to files that
exist, and to headings that exist in them; it stays a short guide; it keeps the two
set-up commands, a contract with whoever reads it first; and no page refers to the
project's private history (planning notes, tracker numbers) that a reader cannot open.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = sorted((ROOT / "docs").glob("*.md"))
README_MAX_LINES = 200
SETUP_COMMANDS = ("ops/scheduler demo", "ops/test")

# Words that point at material a reader of the docs cannot open. "seed" alone, not a
# hash function's seed (`seed=0` in the key contract, "murmur3 with seed 1").
PRIVATE = {
    "seed": re.compile(r"\bseeds?\b(?!\s*=?\s*\d)", re.I),
    "issue N": re.compile(r"\bissues?\s*#?\d+", re.I),
    "wave": re.compile(r"\bwaves?\b", re.I),
}

LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
INLINE_CODE = re.compile(r"`[^`\n]*`")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


def prose(text: str) -> str:
    """``text`` without fenced code blocks and inline code: a link or a word inside code
    is an example, not a reference."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """The anchor Python-Markdown's toc extension (what mkdocs uses) gives a heading."""
    text = re.sub(r"<[^>]+>", "", heading.replace("`", ""))
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(path: Path) -> set[str]:
    return {slug(h) for h in HEADING.findall(FENCE.sub("", path.read_text(encoding="utf-8")))}


def broken_links(path: Path) -> list[str]:
    """Every relative link of the Markdown file ``path`` whose file, or whose anchor in a
    Markdown file, does not exist."""
    bad = []
    for target in LINK.findall(prose(path.read_text(encoding="utf-8"))):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            bad.append(f"{path.name}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{path.name}: {target} (no such heading)")
    return bad


def private_words(text: str) -> list[str]:
    found = prose(text)
    return [name for name, pattern in PRIVATE.items() if pattern.search(found)]


def test_the_readme_is_a_short_guide() -> None:
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; keep it <= {README_MAX_LINES}"


@pytest.mark.parametrize("command", SETUP_COMMANDS)
def test_the_readme_keeps_the_set_up_commands(command: str) -> None:
    text = README.read_text(encoding="utf-8")
    assert re.search(rf"^{re.escape(command)}\s", text, re.M), f"README.md lost `{command}`"


@pytest.mark.parametrize("path", [README, *PAGES], ids=lambda p: p.name)
def test_every_relative_link_points_at_something_that_exists(path: Path) -> None:
    assert broken_links(path) == []


@pytest.mark.parametrize("path", [README, *PAGES], ids=lambda p: p.name)
def test_no_page_refers_to_private_history(path: Path) -> None:
    assert private_words(path.read_text(encoding="utf-8")) == []


def test_the_site_lists_every_page() -> None:
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    missing = [p.name for p in PAGES if not re.search(rf":\s*{re.escape(p.name)}\s*$", nav, re.M)]
    assert missing == [], f"pages missing from mkdocs.yml's nav: {missing}"


# The checks themselves must be able to fail.


def test_a_broken_link_or_anchor_is_found(tmp_path: Path) -> None:
    (tmp_path / "there.md").write_text("# A heading: `code`\n\n## Second one\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](there.md) [ok](there.md#a-heading-code) [ok](there.md#second-one) "
        "[ok](https://example.org/x) [ok](#top)\n# Top\n"
        "[gone](missing.md) [bad anchor](there.md#nope) ![img](pic.png)\n"
        "```\n[in code](ignored.md)\n```\n"
    )
    assert broken_links(page) == [
        "page.md: missing.md (no such file)",
        "page.md: there.md#nope (no such heading)",
        "page.md: pic.png (no such file)",
    ]


def test_private_words_are_found_but_a_hash_seed_is_not() -> None:
    assert private_words("as the seed said") == ["seed"]
    assert private_words("fixed in issue 12, see issue #7") == ["issue N"]
    assert private_words("the second wave") == ["wave"]
    assert private_words("murmur3(utf8(id), seed=0); with seed 1; the issues we saw; a wavelet") == []
    assert private_words("`seed` in code") == []
