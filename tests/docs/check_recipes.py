"""tests/docs/check_recipes.py — the "How to add ..." recipes of docs/architecture.md name the
files a change of that kind really touches (ctest -R recipes).

A recipe is a `## How to ...` section whose numbered items each start with a backticked path
("1. `include/dion/train/config.h`: ..."): the files to touch. Each recipe here names one real
instance of its kind (a config key that reaches the optimizer: `ortho_fraction`), and the check
is that the files under src/, include/, tools/ and python/ naming that instance are exactly the
recipe's files there, and that the recipe's other files (docs/train.md) exist and name it too
(as tests/optim/algorithm_names.py does for an algorithm's name). A new recipe is one more entry
in RECIPES. Also checked: the files that ask the layout who holds which part (the gradient norm,
the replica check, the checkpoints, QK-clip) name no axis in their code (ASK_THE_LAYOUT).

Before checking the tree it checks itself: a planted extra file and a planted missing one must
both fail (a check that cannot fail is no check).

    python3 tests/docs/check_recipes.py [REPO_ROOT]      # exit 0 when all hold, 1 otherwise
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parents[2])
DOC = "docs/architecture.md"
SEARCHED = ("src", "include", "tools", "python")  # where code names things; docs/ and tests/ are not

# section: the heading's text after "## "; example: a real instance, as a whole word.
RECIPES = [
    {"section": "How to add a parallel axis", "example": "efs"},
    {"section": "How to add a config key", "example": "ortho_fraction"},
]

ITEM = re.compile(r"^\s*\d+\.\s+`([^`]+)`", re.M)


def section_text(doc, title):
    m = re.search(r"^## " + re.escape(title) + r"[ \t]*\n(.*?)(?=^## |\Z)", doc, re.S | re.M)
    return m.group(1) if m else None


def listed_files(text):
    return [p.rstrip("/") for p in ITEM.findall(text)]


def files_naming(root, word):
    pattern = re.compile(r"\b" + re.escape(word) + r"\b")
    out = set()
    for top in SEARCHED:
        for p in (root / top).rglob("*"):
            if p.is_file() and "__pycache__" not in p.parts:
                try:
                    text = p.read_text(errors="ignore")
                except OSError:
                    continue
                if pattern.search(text):
                    out.add(p.relative_to(root).as_posix())
    return out


def check(recipe, listed, found, exists, names):
    """The problems of one recipe: `listed` its files, `found` the searched files naming its
    example, `exists(path)` and `names(path)` for the listed files outside the searched tops."""
    title, word = recipe["section"], recipe["example"]
    problems = []
    if not listed:
        return [f"{DOC}: '## {title}' lists no files (numbered items starting with a `path`)"]
    in_code = {p for p in listed if p.split("/")[0] in SEARCHED}
    for p in sorted(found - in_code):
        problems.append(f"'{title}': {p} names '{word}' but the recipe does not list it")
    for p in sorted(in_code - found):
        problems.append(f"'{title}': the recipe lists {p}, which does not name '{word}'"
                        + ("" if exists(p) else " (no such file)"))
    for p in sorted(set(listed) - in_code):
        if not exists(p):
            problems.append(f"'{title}': the recipe lists {p}, which does not exist")
        elif not names(p):
            problems.append(f"'{title}': the recipe lists {p}, which does not name '{word}'")
    return problems


def self_check():
    recipe = {"section": "How to add a thing", "example": "thing"}
    listed = ["src/a.cpp", "include/a.h", "docs/a.md"]
    yes = lambda p: True  # noqa: E731
    good = check(recipe, listed, {"src/a.cpp", "include/a.h"}, yes, yes)
    extra = check(recipe, listed, {"src/a.cpp", "include/a.h", "tools/b.cpp"}, yes, yes)
    missing = check(recipe, listed, {"src/a.cpp"}, yes, yes)
    undocumented = check(recipe, listed, {"src/a.cpp", "include/a.h"}, yes, lambda p: False)
    doc = "# T\n\n## How to add a thing\n\n1. `src/a.cpp`: x\n2. `include/a.h`: y\n\n## Next\n\n1. `z.cpp`\n"
    parsed = listed_files(section_text(doc, "How to add a thing"))
    ok = not good and extra and missing and undocumented and parsed == ["src/a.cpp", "include/a.h"]
    if not ok:
        print("FAIL: check_recipes.py's self-check: a planted extra, missing or undocumented file "
              f"was not caught, or the list was misread ({good}, {extra}, {missing}, {undocumented}, {parsed})")
    return ok


# The files that ask the layout who holds which part (docs/architecture.md, "Inside the train
# layer"): their code names no axis: no split dim of a placement (.fs_dim, .tp_dim, .ep_dim, .efs),
# no rank or group of an axis (tp_rank, dp_group, ...), no Axis:: group. Comments and strings aside.
ASK_THE_LAYOUT = ("src/train/grad_norm.cpp", "src/train/parallel/replicas.cpp", "src/train/qk_clip.cpp",
                  "src/train/io/checkpoint_*.cpp")
AXIS_CODE = re.compile(r"\.(fs_dim|tp_dim|ep_dim|efs)\b|\b(dp|fs|tp|ep|edp|efs|data)_(rank|group)\b|(?<![A-Za-z_])Axis::")
COMMENT_OR_STRING = re.compile(r'//[^\n]*|"(?:\\.|[^"\\\n])*"')


def axis_code(text):
    """The lines of `text` whose code (comments and strings removed) names an axis."""
    return [line.strip() for line in text.splitlines() if AXIS_CODE.search(COMMENT_OR_STRING.sub("", line))]


def ownership_problems(root):
    problems, files = [], []
    for pattern in ASK_THE_LAYOUT:
        matched = sorted(root.glob(pattern))
        if not matched:
            problems.append(f"no file matches {pattern} (moved? update ASK_THE_LAYOUT)")
        files += matched
    for p in files:
        for line in axis_code(p.read_text()):
            problems.append(f"{p.relative_to(root).as_posix()} names an axis instead of asking the layout: {line}")
    return problems, len(files)


def ownership_self_check():
    bad = axis_code("if (pl.tp_dim < 0) continue;\nauto& g = *mesh.group(Axis::dp);\nint r = par.tp_rank();")
    fine = axis_code('const Box b = par.box(w);  // not .tp_dim\nthrow Error("fs_dim");\nReplicaAxis::dp;')
    ok = len(bad) == 3 and not fine
    if not ok:
        print(f"FAIL: check_recipes.py's ownership self-check: {bad} / {fine}")
    return ok


def main():
    if not self_check() or not ownership_self_check():
        return 1
    doc = (ROOT / DOC).read_text()
    problems = []
    for recipe in RECIPES:
        text = section_text(doc, recipe["section"])
        if text is None:
            problems.append(f"{DOC}: no section '## {recipe['section']}'")
            continue
        listed = listed_files(text)
        word = recipe["example"]
        found = files_naming(ROOT, word)
        pattern = re.compile(r"\b" + re.escape(word) + r"\b")
        problems += check(recipe, listed, found, lambda p: (ROOT / p).is_file(),
                          lambda p: bool(pattern.search((ROOT / p).read_text(errors="ignore"))))
        print(f"'{recipe['section']}' ({word}): lists {', '.join(listed)}; "
              f"{len(found)} files under {', '.join(SEARCHED)} name it: {', '.join(sorted(found))}")
    owned, n = ownership_problems(ROOT)
    problems += owned
    print(f"who holds which part: {n} files ask the layout ({', '.join(ASK_THE_LAYOUT)}); "
          f"{len(owned)} name an axis")
    for p in problems:
        print("FAIL: " + p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
