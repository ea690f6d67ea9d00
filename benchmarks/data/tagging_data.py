"""Build a real token-tagging data set from the manual pages this machine has (nothing downloaded).

    python benchmarks/data/tagging_data.py --out data/man_tags/      # train/valid/test .jsonl

Each page of /usr/share/man/man{1,5,8} (user commands, file formats, administration) is typeset
by groff, as `man` shows it, with its bold and italic kept (groff's overstrikes). Its text is cut
into sentences of words; each word is tagged by what it objectively is, as the page marks it or
as its form says:

    CMD    a command: the name of an executable on this machine (/usr/bin, /bin, /usr/sbin,
           /sbin) where the page names it as a manual page (grep(1), grep(8)), or where it is one
           of the page's own commands (its NAME line lists them) in that line or set in bold
    OPT    a command-line option: -v, --verbose, --file=FILE
    VAR    a placeholder the reader fills in: a word the page sets in italics (FILE, pattern)
    PATH   a file or directory path: /etc/passwd, ~/.bashrc, $HOME/.config
    URL    http://, https://, ftp:// or www. addresses
    EMAIL  an e-mail address

Everything else is O; tags are IOB2, one entity per word. What makes it a task to learn and not
a table to look up: the split is by page (no page is in two splits), so the test's commands,
options and paths are mostly unseen; command names are often English words (find, test, install,
patch, time, which) that are commands only where the page marks them; placeholders are
typographic (the same "file" is a VAR in one sentence and O in the next); the model reads plain
text, never the page's bold and italics. The dictionary baseline (the spans seen in training)
finds the common options and commands and misses the rest.

Pages: every page of those sections but the Google Cloud SDK's (~16,600 generated pages, nearly
alike: GCLOUD_PAGES of them, sampled). Sentences: 4-60 words, at most PER_PAGE per page (a seeded
sample), duplicates dropped (a
sentence seen in training is dropped from validation and test: coreutils' "--help display this
help and exit" is in a hundred pages). Pages hash (seeded) into test (TEST_SHARE), validation
(VALID_SHARE) and training.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import random
import re
import subprocess
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

SECTIONS = ("man1", "man5", "man8")
PER_PAGE = 20
GCLOUD_PAGES = 150  # of its ~16,600 near-identical generated pages (the machine's other pages: ~2,000)
TEST_SHARE, VALID_SHARE = 0.08, 0.05
MIN_WORDS, MAX_WORDS = 4, 60
BIN_DIRS = ("/usr/bin", "/bin", "/usr/sbin", "/sbin", "/usr/games")

URL = re.compile(r"^((https?|ftp)://|www\.)\S+$")
EMAIL = re.compile(r"^<?[\w.+-]+@[\w-]+(\.[\w-]+)+>?$")
PATH = re.compile(r"^(/|~/|\$HOME/|\./|\.\./)[\w.@%+~/,:=-]*[\w/*-]$")
OPT = re.compile(r"^(--[A-Za-z0-9][\w.-]*|-[A-Za-z][\w-]*)(=\S*)?$")
VAR = re.compile(r"^[A-Za-z][\w-]*$")
REF = re.compile(r"^(.+)\((\d\w*)\)$")  # grep(1)
LEAD, TRAIL = "([{\"'“‘«", ")]}\"'”’».,;:!?"


def executables() -> set[str]:
    names = set()
    for d in BIN_DIRS:
        try:
            names.update(n for n in os.listdir(d) if os.access(os.path.join(d, n), os.X_OK))
        except OSError:
            pass
    return names


def render(page: Path) -> str:
    """The page as `man` shows it, bold and italic as <b>/<i> runs, paragraphs one line each."""
    try:
        source = gzip.decompress(page.read_bytes()) if page.suffix == ".gz" else page.read_bytes()
        out = subprocess.run(["groff", "-man", "-t", "-Tutf8", "-P-c", "-rLL=5000n", "-rHY=0"], input=source,
                             capture_output=True, timeout=30).stdout.decode("utf-8", "replace")
    except (OSError, subprocess.SubprocessError, EOFError):
        return ""
    out = re.sub(r"_\x08(.)", lambda m: "\x01" + m.group(1), out)  # italic (underlined): \x01 + char
    return re.sub(r"(.)\x08\1", lambda m: "\x02" + m.group(1), out)  # bold (overstruck): \x02 + char


def styled_words(line: str) -> list[tuple[str, str]]:
    """(word, style) for each whitespace-separated word: "b" if most of its letters are bold, "i"
    if italic, "" else."""
    words, chars, marks = [], [], []
    mark = ""
    for c in line + " ":
        if c in "\x01\x02":
            mark = "i" if c == "\x01" else "b"
            continue
        if c.isspace():
            if chars:
                counts = Counter(m for m, ch in zip(marks, chars, strict=True)
                                 if ch.isalnum() or ch in "-_/.")
                style = max(("b", "i"), key=lambda s: counts[s]) if counts["b"] + counts["i"] else ""
                if style and counts[style] * 2 < sum(counts.values()):
                    style = ""
                words.append(("".join(chars), style))
            chars, marks = [], []
        else:
            chars.append(c)
            marks.append(mark)
        mark = ""
    return words


def kind_of(word: str, style: str, following: str, commands: set[str], own: set[str]) -> str:
    if URL.match(word):
        return "URL"
    if EMAIL.match(word):
        return "EMAIL"
    if PATH.match(word) and len(word) > 2:
        return "PATH"
    if OPT.match(word):
        return "OPT"
    if word in commands and (following in ("(1)", "(8)") or (word in own and style == "b")):
        return "CMD"
    if style == "i" and VAR.match(word):
        return "VAR"
    return "O"


def tokens_of(words: list[tuple[str, str]], commands: set[str], own: set[str]) -> list[tuple[str, str]]:
    """(token, tag) of a paragraph: punctuation split from words (not from a path, URL or option
    whose shape holds it), a manual reference grep(1) as grep ( 1 )."""
    out = []
    for word, style in words:
        lead, trail = [], []
        while word and word[0] in LEAD and len(word) > 1:
            lead.append(word[0])
            word = word[1:]
        while word and word[-1] in TRAIL and len(word) > 1:
            trail.insert(0, word[-1])
            word = word[:-1]
        ref = REF.match(word)
        following = ""
        if ref and ref.group(1):
            word, following = ref.group(1), f"({ref.group(2)})"
        out += [(c, "O") for c in lead]
        kind = kind_of(word, style, following, commands, own) if word else "O"
        out.append((word, f"B-{kind}" if kind != "O" else "O"))
        if following:
            out += [("(", "O"), (following[1:-1], "O"), (")", "O")]
        out += [(c, "O") for c in trail]
    return [(t, g) for t, g in out if t]


def sentences(page: Path, commands: set[str], seed: int) -> list[dict]:
    text = render(page)
    found, own, heading = [], set(), ""
    for line in text.splitlines():
        if not line.startswith("   ") or not line.strip():
            heading = re.sub(r"[\x01\x02]", "", line).strip() or heading
            continue  # headings (NAME, OPTIONS...) and the page's header and footer
        if heading == "NAME" and not own:  # "grep, egrep, fgrep - print lines...": its commands
            names = re.sub(r"[\x01\x02]", "", line).split(" - ")[0]
            own = {n for n in re.split(r"[,\s]+", names) if n} & commands
            styled = [(w, "b" if w.rstrip(",") in own else s) for w, s in styled_words(line.strip())]
        else:
            styled = styled_words(line.strip())
        tokens = tokens_of(styled, commands, own)
        start = 0
        for i, (token, _) in enumerate(tokens):  # a sentence ends at . ! ? before an uppercase word
            end = i + 1 == len(tokens) or (token in ".!?" and tokens[i + 1][0][:1].isupper())
            if end:
                words = tokens[start : i + 1]
                start = i + 1
                if MIN_WORDS <= len(words) <= MAX_WORDS:
                    found.append({"tokens": [t for t, _ in words], "tags": [g for _, g in words]})
    rng = random.Random(f"{seed}/{page.name}")
    return rng.sample(found, min(PER_PAGE, len(found)))


def split_of(name: str, seed: int) -> str:
    u = int.from_bytes(hashlib.blake2b(f"{seed}\0{name}".encode(), digest_size=8).digest(), "big") / 2**64
    return "test" if u < TEST_SHARE else "valid" if u < TEST_SHARE + VALID_SHARE else "train"


def _page_job(args):
    page, commands, seed = args
    return page, sentences(page, commands, seed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--pages", type=int, default=None, help="at most this many pages (a seeded sample)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    commands = executables()
    pages = sorted(p for s in SECTIONS for p in Path("/usr/share/man", s).glob("*") if p.is_file()
                   and not p.is_symlink())
    rng = random.Random(args.seed)
    gcloud = [p for p in pages if p.name.startswith("gcloud")]
    pages = [p for p in pages if not p.name.startswith("gcloud")]
    pages += rng.sample(gcloud, min(GCLOUD_PAGES, len(gcloud)))
    if args.pages is not None:
        pages = rng.sample(pages, min(args.pages, len(pages)))
    pages.sort()
    splits: dict[str, list[dict]] = {"train": [], "valid": [], "test": []}
    jobs = [(p, commands, args.seed) for p in pages]
    with ProcessPoolExecutor(args.workers) as pool:
        for page, found in pool.map(_page_job, jobs, chunksize=16):
            splits[split_of(page.name.split(".")[0], args.seed)] += found
    seen: set[tuple] = set()
    for name in ("train", "valid", "test"):  # training first: a sentence it has leaves the others
        kept = []
        for r in splits[name]:
            key = tuple(r["tokens"])
            if key not in seen:
                seen.add(key)
                kept.append(r)
        splits[name] = kept
    args.out.mkdir(parents=True, exist_ok=True)
    for name, rows in splits.items():
        lines = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
        (args.out / f"{name}.jsonl").write_text(lines)
        types = Counter(t[2:] for r in rows for t in r["tags"] if t != "O")
        print(f"{name}: {len(rows):,} sentences, {sum(len(r['tokens']) for r in rows):,} words, "
              f"entities {dict(types.most_common())}")


if __name__ == "__main__":
    main()
