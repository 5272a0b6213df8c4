"""The README is a landing page a newcomer reads in five minutes: short, no wall of text, no issue numbers or commit
hashes, the two commands named, the reproduce section before any result, and the rendered tables' marker pairs in
place (``python -m grounding.docs_tables`` fills them). The results pages (``docs/results/*.md``) are at most 40,000
characters, a finding's paragraph at most 800, and none of their tables is typed: each is rendered from its record.
Every checker is also run on a bad example, so each can fail."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from grounding.docs_tables import END, START

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

MAX_LINES = 120
MAX_CHARS = 10_000
MAX_PARAGRAPH = 600
MARKERS = ("leaderboard_flickr8k_full", "papers_claims")
RESULTS_PAGES = sorted((ROOT / "docs" / "results").glob("*.md"))
MAX_PAGE_CHARS = 40_000
MAX_FINDING = 800
# the README's one table that is not a result: the documentation index
NOT_RESULTS = ("| page | what it holds |",)

LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+")
ISSUE = re.compile(r"\bissues?\s*#?\d+|(?<![\w&/])#\d+\b", re.IGNORECASE)
# 7-40 hex digits holding at least one digit and one letter: a commit hash, not a word ("defaced") or a count
HASH = re.compile(r"(?<![\w-])(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![\w-])", re.IGNORECASE)


def paragraphs(text: str) -> list[str]:
    """Runs of non-blank lines outside code fences and tables; a list item starts a paragraph of its own (its
    indented continuation lines belong to it)."""
    found: list[list[str]] = []
    current: list[str] | None = None
    fenced = False
    for line in text.splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fenced, current = not fenced, None
            continue
        if fenced or not line.strip() or line.lstrip().startswith("|"):
            current = None
            continue
        if current is None or LIST_ITEM.match(line):
            current = []
            found.append(current)
        current.append(line.strip())
    return [" ".join(p) for p in found]


def length_problems(text: str) -> list[str]:
    problems = []
    lines = text.count("\n") + (0 if text.endswith("\n") or not text else 1)
    if lines > MAX_LINES:
        problems.append(f"{lines} lines (at most {MAX_LINES})")
    if len(text) > MAX_CHARS:
        problems.append(f"{len(text):,} characters (at most {MAX_CHARS:,})")
    for p in paragraphs(text):
        if len(p) > MAX_PARAGRAPH:
            problems.append(f"a paragraph of {len(p)} characters (at most {MAX_PARAGRAPH}): {p[:80]}...")
    return problems


def reference_problems(text: str) -> list[str]:
    return ([f"issue number: {m.group(0)!r}" for m in ISSUE.finditer(text)]
            + [f"commit hash: {m.group(0)!r}" for m in HASH.finditer(text)])


def marker_start(text: str, name: str) -> int:
    """Where the opening marker of ``name`` starts (its own line; the renderer's attributes allowed), else -1."""
    m = re.search(rf"^<!--\s*table:\s*{re.escape(name)}(?:\s[^\n]*?)?\s*-->$", text, re.MULTILINE)
    return m.start() if m else -1


def marker_problems(text: str) -> list[str]:
    problems = []
    for name in MARKERS:
        start = marker_start(text, name)
        if start < 0:
            problems.append(f"no <!-- table: {name} --> marker")
            continue
        end = text.find("<!-- /table -->", start)
        nxt = text.find("<!-- table: ", start + 1)
        if end < 0 or 0 <= nxt < end:
            problems.append(f"<!-- table: {name} --> has no <!-- /table --> before the next marker")
    return problems


def order_problems(text: str) -> list[str]:
    """The reproduce section comes before the first rendered results table."""
    reproduce = re.search(r"^#{2,3} Reproduce", text, re.MULTILINE)
    first_table = min((i for i in (marker_start(text, n) for n in MARKERS) if i >= 0), default=-1)
    if reproduce is None:
        return ["no '## Reproduce ...' section"]
    if 0 <= first_table < reproduce.start():
        return ["a results table comes before the reproduce section"]
    return []


def typed_tables(text: str, allowed: tuple[str, ...] = ()) -> list[str]:
    """The header line of every Markdown table outside a ``<!-- table: NAME -->`` ... ``<!-- /table -->`` pair and
    outside code fences (a table typed by hand), except those whose header is in ``allowed``."""
    found, fenced, rendered, previous = [], False, False, ""
    for line in text.splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        elif not fenced and START.match(line):
            rendered = True
        elif not fenced and END.match(line):
            rendered = False
        elif (not fenced and not rendered and line.lstrip().startswith("|") and not previous.lstrip().startswith("|")
              and line.strip() not in allowed):
            found.append(line.strip())
        previous = line
    return found


def results_page_problems(text: str) -> list[str]:
    problems = [f"{len(text):,} characters (at most {MAX_PAGE_CHARS:,})"] if len(text) > MAX_PAGE_CHARS else []
    problems += [f"a paragraph of {len(p)} characters (at most {MAX_FINDING}): {p[:80]}..."
                 for p in paragraphs(text) if len(p) > MAX_FINDING]
    problems += [f"a typed table (render it from a record, docs/records/README.md): {h[:80]}" for h in typed_tables(text)]
    return problems


@pytest.fixture(scope="module")
def readme() -> str:
    return README.read_text(encoding="utf-8")


def test_readme_is_short(readme):
    assert not length_problems(readme), "\n".join(length_problems(readme))


def test_readme_names_no_issue_or_commit(readme):
    assert not reference_problems(readme), "\n".join(reference_problems(readme))


def test_readme_names_the_two_commands(readme):
    for command in ("make test", "make demo"):
        assert command in readme, f"the README does not name `{command}`"


def test_readme_holds_both_marker_pairs(readme):
    assert not marker_problems(readme), "\n".join(marker_problems(readme))


def test_readme_reproduce_comes_before_results(readme):
    assert not order_problems(readme), "\n".join(order_problems(readme))


def test_readme_types_no_table(readme):
    assert not typed_tables(readme, NOT_RESULTS), typed_tables(readme, NOT_RESULTS)


@pytest.mark.parametrize("page", RESULTS_PAGES, ids=[p.stem for p in RESULTS_PAGES])
def test_results_pages_are_short_and_render_every_table(page):
    problems = results_page_problems(page.read_text(encoding="utf-8"))
    assert not problems, f"{page.relative_to(ROOT)}:\n" + "\n".join(problems)


# The checkers themselves, on bad and good examples.

def test_length_checker_catches_lines_characters_and_paragraphs():
    assert any("lines" in p for p in length_problems("a\n\n" * 61))
    assert not any("lines" in p for p in length_problems("a\n\n" * 60))
    assert any("characters (at most 10,000)" in p for p in length_problems("```\n" + "x" * 10_001 + "\n```\n"))
    long = "word " * 121  # 605 characters
    assert any("a paragraph of" in p for p in length_problems(long + "\n"))
    assert any("a paragraph of" in p for p in length_problems("- short item\n- " + long + "\n"))
    # one paragraph split over lines counts as one
    assert any("a paragraph of" in p for p in length_problems(("word " * 61 + "\n") * 2))
    # code blocks and tables are not paragraphs; list items and blank lines split paragraphs
    assert not length_problems(f"```\n{long}\n```\n\n| {long} |\n|---|\n")
    assert not length_problems(("- " + "word " * 70 + "\n") * 2)
    assert not length_problems(("word " * 70 + "\n\n") * 2)


def test_results_page_checker_catches_size_findings_and_typed_tables():
    rendered = "<!-- table: board -->\n| a | b |\n|---|---|\n| 1 | 2 |\n<!-- /table -->\n"
    assert not results_page_problems("# R\n\n" + rendered + "\nA finding.\n")
    assert any("typed table" in p for p in results_page_problems("# R\n\n| a | b |\n|---|---|\n| 1 | 2 |\n"))
    assert not results_page_problems("```\n| a | b |\n```\n")  # an example in a fence is not a table
    assert typed_tables(rendered + "\n| page | what it holds |\n|---|---|\n", NOT_RESULTS) == []
    assert typed_tables(rendered + "\n| x | y |\n|---|---|\n", NOT_RESULTS) == ["| x | y |"]
    assert any("a paragraph of" in p for p in results_page_problems("word " * 161 + "\n"))  # 805 characters
    assert not results_page_problems("word " * 159 + "\n")
    assert any("characters (at most 40,000)" in p for p in results_page_problems(("word " * 100 + "\n\n") * 81))


def test_paragraphs_split_as_described():
    text = "Intro line one\nline two\n\n- item one\n  continued\n- item two\n\n```\ncode\n```\n| a | b |\nafter"
    assert paragraphs(text) == ["Intro line one line two", "- item one continued", "- item two", "after"]


def test_reference_checker_catches_issues_and_hashes():
    assert reference_problems("fixed in issue 29.")
    assert reference_problems("see Issue #31")
    assert reference_problems("(#28)")
    assert reference_problems("recorded at bde059d")
    assert reference_problems("commit 7fcc6a7f0c2e9d1b3a4f5e6d7c8b9a0f1e2d3c4b")
    for fine in ("6,000 photos", "a defaced wall", "1000268201", "docs/results/benchmark.md#anchor", "R@10 is 73.9",
                 "`python -m grounding fit`", "an image.jpg#0 caption"):
        assert not reference_problems(fine), fine


def test_marker_and_order_checkers_can_fail():
    good = "## Reproduce on your data\n<!-- table: leaderboard_flickr8k_full -->\n<!-- /table -->\n" \
           "<!-- table: papers_claims -->\n<!-- /table -->\n"
    assert not marker_problems(good) and not order_problems(good)
    assert marker_problems(good.replace("<!-- table: papers_claims -->\n", ""))
    assert marker_problems("<!-- table: leaderboard_flickr8k_full -->\n<!-- table: papers_claims -->\n<!-- /table -->")
    assert marker_problems(good.replace("leaderboard_flickr8k_full", "leaderboard_flickr8k_fullx"))
    with_attributes = good.replace("papers_claims -->", "papers_claims columns=claim,verdict digits=1 -->")
    assert not marker_problems(with_attributes) and not order_problems(with_attributes)
    assert order_problems(good.replace("## Reproduce on your data\n", "") + "## Reproduce on your data\n")
    assert order_problems("no section at all")
