"""README.md and docs/**/*.md render as written, parsed with a real CommonMark parser
(markdown-it-py, the one ``rich`` uses): every code fence is closed by its own closing line, no
heading is swallowed by a code block, no heading appears twice in a file, and every line that
starts a command (``cselab train ...``, the commands taken from the real parser) is inside a
code block, so a stray fence cannot turn the rest of a page inside out again."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cselab.cli import build_parser

markdown_it = pytest.importorskip("markdown_it")

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def commands() -> list[str]:
    """The subcommands of ``cselab`` (train, config, evaluate, ...), from the real parser."""
    (sub,) = [a for a in build_parser()._actions if a.dest == "command"]
    return sorted(sub.choices)


COMMAND_LINE = re.compile(rf"^\s*cselab ({'|'.join(commands())})(\s|$)")
HEADING_LINE = re.compile(r"^#{2,6} \S")  # "# x" is also a shell or Python comment: not checked


def problems(text: str) -> list[str]:
    """What renders otherwise than written, one line each (``line N: ...``); ``[]`` if nothing."""
    lines = text.splitlines()
    tokens = markdown_it.MarkdownIt("commonmark").parse(text)
    found: list[str] = []
    code_lines: set[int] = set()  # 0-based source lines inside code blocks (fences included)
    headings: dict[str, int] = {}
    heading_lines: set[int] = set()
    for i, tok in enumerate(tokens):
        if tok.type in ("fence", "code_block") and tok.map:
            start, end = tok.map
            code_lines.update(range(start, end))
            if tok.type == "fence":
                last = lines[end - 1].strip() if end - 1 > start else ""
                if not (last.startswith(tok.markup) and set(last) <= {tok.markup[0]}):
                    found.append(f"line {start + 1}: code fence {tok.markup} is never closed")
        if tok.type == "heading_open" and tok.map:
            heading_lines.add(tok.map[0])
            title = tokens[i + 1].content
            if title in headings:
                found.append(
                    f"line {tok.map[0] + 1}: heading {title!r} again (first on line "
                    f"{headings[title] + 1})"
                )
            headings.setdefault(title, tok.map[0])
    for n, line in enumerate(lines):
        if COMMAND_LINE.match(line) and n not in code_lines:
            found.append(f"line {n + 1}: command outside a code block: {line.strip()}")
        if HEADING_LINE.match(line) and n not in heading_lines:
            found.append(f"line {n + 1}: heading inside a code block: {line.strip()}")
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_page_renders_as_written(page: Path) -> None:
    assert problems(page.read_text(encoding="utf-8")) == []


def test_readme_sections_and_commands_render() -> None:
    """The README's headings are headings and its commands are code, as a reader sees them."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    tokens = markdown_it.MarkdownIt("commonmark").parse(text)
    titles = [tokens[i + 1].content for i, t in enumerate(tokens) if t.type == "heading_open"]
    assert {"Evaluate", "Plots, sweeps over seeds, loggers", "Develop (from a clone)"} <= set(
        titles
    )
    code = "".join(t.content for t in tokens if t.type == "fence")
    for line in ("cselab compare mine.json other.json --plot scores.png",
                 "cselab evaluate outputs/mine/best --sts-file my_pairs.tsv -o mine.json",
                 "cselab plot outputs/simcse outputs/focal -o curves.png"):  # fmt: skip
        assert line in code


BROKEN = """# Page

## Evaluate

```bash
cselab evaluate model
```

Some prose.
cselab compare a.json b.json
```

## Plots

```bash
cselab plot run -o curves.png
```

## Plots
"""


def test_the_checks_see_a_stray_fence() -> None:
    """The README's old fault: a stray fence after a paragraph opens a block that swallows the
    next heading (up to the next bare fence), and the commands before it render as prose."""
    assert problems(BROKEN) == [
        "line 10: command outside a code block: cselab compare a.json b.json",
        "line 13: heading inside a code block: ## Plots",
    ]
    assert problems(BROKEN.replace("cselab compare a.json b.json\n```\n", "")) == [
        "line 17: heading 'Plots' again (first on line 11)"
    ]
    unclosed = "# Page\n\n```bash\ncselab train\n\n## Next\n"
    assert problems(unclosed) == [
        "line 3: code fence ``` is never closed",
        "line 6: heading inside a code block: ## Next",
    ]
