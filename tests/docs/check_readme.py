"""tests/docs/check_readme.py — README.md and docs/*.md say only what is true of this checkout.

What it checks (ctest -R readme_docs):
  1. every repo-relative path that README.md or a docs/*.md page names exists: markdown link
     targets (relative to the page) and the words in `backticks` that start with a top-level
     entry of the repository (scripts/, docs/, include/, CHANGELOG.md, ...), or header paths
     `dion/...h` (under include/). Paths that .gitignore covers (runs/, build/, data/shakespeare/)
     are what the programs write, and are not required. Fenced code blocks are commands, not
     claims about the tree: they are not read for paths.
  2. the README's example blocks equal examples/readme_example.cpp and examples/readme_example.py
     byte for byte (the README shows them verbatim; ctest builds and runs them:
     readme_example_cpp, readme_example_py).
  3. docs/train.md lists every dion-train key of src/train/config_keys.cpp (in `backticks`).
  4. the docs budget: `wc -w docs/*.md` at most 25,000 words; README.md at most 300 lines.
Before checking the checkout it checks itself: a README with a missing path, and one whose example
differs from its file, must both fail (a check that cannot fail is no check).

    python3 tests/docs/check_readme.py [REPO_ROOT]      # exit 0 when all hold, 1 otherwise
"""
import fnmatch
import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parents[2])
DOCS_WORD_BUDGET = 25000
README_MAX_LINES = 300
EXAMPLES = ["examples/readme_example.cpp", "examples/readme_example.py"]

FENCE = re.compile(r"^```[^\n]*\n(.*?)^```[ \t]*$", re.S | re.M)
LINK = re.compile(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
TICKS = re.compile(r"`([^`\n]+)`")
PATHLIKE = re.compile(r"^[A-Za-z0-9_.+-]+(/[A-Za-z0-9_.+-]+)*/?$")


def top_level(root):
    """The repository's top-level entries (what a repo-relative path starts with)."""
    return {p.name for p in root.iterdir() if not p.name.startswith(".") and not p.name.startswith("build")}


def fenced_blocks(text):
    return [m.group(1) for m in FENCE.finditer(text)]


def prose(text):
    """The text without its fenced code blocks."""
    return FENCE.sub("", text)


def named_paths(page, text, tops):
    """(path relative to the repository root, as written) for each path the page names."""
    out = []
    body = prose(text)
    for m in LINK.finditer(body):
        target = m.group(1).split("#")[0]
        if not target or re.match(r"^[a-z]+:", target):
            continue  # an anchor or a URL
        out.append((os.path.normpath(os.path.join(str(page.parent.relative_to(ROOT)), target)), target))
    for m in TICKS.finditer(body):
        for word in m.group(1).split():
            word = re.sub(r"[,.;:)]+$", "", word)
            word = re.sub(r":\d+(-\d+)?$", "", word)  # file:line
            if not PATHLIKE.match(word) or word.startswith(("/", "..")):
                continue
            first = word.split("/")[0]
            if "/" in word and first in tops:
                out.append((word, word))
            elif "/" not in word and first in tops and "." in first:
                out.append((word, word))  # a top-level file: CHANGELOG.md, requirements.txt
            elif first == "dion" and word.endswith(".h"):
                out.append(("include/" + word, word))  # an installed header, as #include names it
    return out


def ignored(paths):
    """The paths that .gitignore covers (outputs of the programs); none when git is unavailable."""
    if not paths:
        return set()
    try:
        # each also as a folder: a pattern such as /data/shakespeare/ matches folders only
        r = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "--no-index", "--stdin"],
                           input="\n".join(q for p in paths for q in (p, p + "/")),
                           capture_output=True, text=True, timeout=60)
        if r.returncode in (0, 1):  # 1: none ignored
            return {p.rstrip("/") for p in r.stdout.split()}
    except (OSError, subprocess.SubprocessError):
        pass
    # No git (a source tarball): the root-anchored patterns of .gitignore (/runs/, /build*/, ...).
    gitignore = ROOT / ".gitignore"
    anchored = [line.strip().strip("/") for line in (gitignore.read_text().splitlines() if gitignore.exists() else [])
                if line.strip().startswith("/")]
    def covered(path):  # the path or a folder above it matches a pattern
        parts = path.split("/")
        return any(fnmatch.fnmatch("/".join(parts[:k]), pat) for k in range(1, len(parts) + 1) for pat in anchored)
    return {p for p in paths if covered(p)}


def check(readme_text, pages, examples):
    """A list of problems: readme_text is README.md's text, pages {path: text} of docs/*.md,
    examples {repo path: text} of the example files."""
    problems = []
    tops = top_level(ROOT)
    named = []
    for page, text in [(ROOT / "README.md", readme_text)] + [(ROOT / p, t) for p, t in pages.items()]:
        for path, written in named_paths(page, text, tops):
            named.append((page.relative_to(ROOT), path, written))
    missing = [(page, path, written) for page, path, written in named
               if not (ROOT / path.rstrip("/")).exists()]
    skip = ignored(sorted({path.rstrip("/") for _, path, _ in missing}))
    for page, path, written in missing:
        if path.rstrip("/") not in skip:
            problems.append(f"{page}: names `{written}`, which does not exist ({path})")
    blocks = fenced_blocks(readme_text)
    for rel, text in examples.items():
        if text not in blocks:
            problems.append(f"README.md: no code block equals {rel} (the README shows it verbatim)")
    keys_src = ROOT / "src" / "train" / "config_keys.cpp"
    if keys_src.exists() and "docs/train.md" in pages:
        src = keys_src.read_text()
        keys = re.findall(r'\{"([a-z_0-9]+)", &Config', src) + re.findall(r'\.name = "([a-z_0-9]+)"', src)
        if len(keys) < 40:
            problems.append(f"{keys_src.relative_to(ROOT)}: found only {len(keys)} keys (has the table's form changed?)")
        for key in keys:
            if f"`{key}`" not in pages["docs/train.md"]:
                problems.append(f"docs/train.md: the dion-train key `{key}` (src/train/config_keys.cpp) is not listed")
    words = sum(len(t.encode().split()) for t in pages.values())
    if words > DOCS_WORD_BUDGET:
        problems.append(f"docs/*.md: {words} words, over the budget of {DOCS_WORD_BUDGET} (wc -w docs/*.md)")
    lines = readme_text.count("\n")
    if lines > README_MAX_LINES:
        problems.append(f"README.md: {lines} lines, over {README_MAX_LINES}")
    return problems, len(named), words


def main():
    readme = (ROOT / "README.md").read_text()
    pages = {str(p.relative_to(ROOT)): p.read_text() for p in sorted((ROOT / "docs").glob("*.md"))}
    examples = {rel: (ROOT / rel).read_text() for rel in EXAMPLES}

    # The check checks itself first: a missing path and a stale example must both be reported.
    bad_path, _, _ = check(readme + "\nSee `scripts/no_such_script.sh`.\n", pages, examples)
    stale = {rel: text + "// changed\n" for rel, text in examples.items()}
    bad_example, _, _ = check(readme, pages, stale)
    no_key = dict(pages)
    no_key["docs/train.md"] = pages["docs/train.md"].replace("`grad_clip`", "grad_clip")  # every mention
    bad_key, _, _ = check(readme, no_key, examples)
    if (not any("no_such_script.sh" in p for p in bad_path) or len(bad_example) < len(EXAMPLES)
            or not any("`grad_clip`" in p for p in bad_key)):
        print("FAIL: the check did not catch a missing path, a changed example or an unlisted key (self-test)")
        return 1

    problems, n_named, words = check(readme, pages, examples)
    for p in problems:
        print("FAIL:", p)
    print(f"readme_docs: {n_named} path mentions checked in README.md and {len(pages)} docs pages; "
          f"{len(examples)} example blocks; docs {words} words (budget {DOCS_WORD_BUDGET})")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
