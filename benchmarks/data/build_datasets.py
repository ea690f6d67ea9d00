"""Build real-text data sets for `tformer train --data` from what this machine already has.

Nothing is downloaded: the texts come from files a Debian system ships.

    python benchmarks/data/build_datasets.py --out data/

writes these files:

en_de.jsonl          {"source", "target"}  English -> German user-interface messages: every
                     translated message of the gettext catalogs /usr/share/locale/de/LC_MESSAGES/*.mo
                     (coreutils, apt, git, gtk, glib, ISO country/language names, ...). Real
                     translations by the projects' translators, with %s / %d placeholders,
                     punctuation and case to keep. Kept: one-line messages of 2-120 characters
                     whose translation is non-empty; plural forms and duplicates (first wins) dropped.
debian_sections.jsonl {"text", "label"}    Debian package summaries (the one-line description,
                     e.g. "Node.js event-based server-side javascript engine") labelled with the
                     package's archive section (libs, utils, python, ...), for the LABELS most
                     frequent sections; from `apt-cache dumpavail` (the package lists apt already
                     has: summaries only), else /var/lib/dpkg/status. Each section is capped at
                     PER_LABEL_CAP packages so libs does not dominate.
man_sections.jsonl   {"text", "label"}    the DESCRIPTION section of each man page (markup
                     dropped) labelled with its section (man1 user commands, man3 library
                     calls, ...): long texts (median ~128 words), for the --max-length choice.
man_pages.jsonl      {"text", "label"}    whole man pages (every section but NAME, markup and
                     headings dropped) labelled with their section, 1,000 a section: long texts
                     whose evidence is spread through them, for --long windows against cut.
debian_described.jsonl {"text", "label"}  the Debian packages with their long description, where
                     the machine has them (dpkg's status; apt's lists hold summaries only).
en_fr_pairs.jsonl    {"anchor", "positive"} an English gettext message and its French
                     translation (the fr catalogs, built as en_de.jsonl): cross-lingual
                     retrieval, as in bitext mining; a from-scratch model must learn that
                     "Datei nicht gefunden"-style strings in two languages mean the same.

The train/validation/test split is left to `tformer train` (a seeded split by input text).
`--only en_de` (comma-separated names) builds only those files: `make demo` needs one, in a
second, where all of them take about ten (the package lists and man pages are the slow part).
"""

from __future__ import annotations

import argparse
import gettext
import glob
import gzip
import json
import random
import re
import subprocess
from collections import Counter
from pathlib import Path

# the files, in order
NAMES = ("en_de", "debian_sections", "debian_described", "man_sections", "en_fr_pairs", "man_pages")
LABELS = 12  # most frequent sections kept for classification
PER_LABEL_CAP = 3000  # at most this many packages per section (libs alone has ~18k)


def gettext_pairs(lang: str = "de") -> list[dict[str, str]]:
    seen: set[str] = set()
    rows = []
    for mo in sorted(glob.glob(f"/usr/share/locale/{lang}/LC_MESSAGES/*.mo")):
        try:
            with open(mo, "rb") as f:
                catalog = gettext.GNUTranslations(f)._catalog
        except Exception:  # a damaged or unusual catalog: skip it
            continue
        for msgid, msgstr in catalog.items():
            if not isinstance(msgid, str) or not msgid or not isinstance(msgstr, str):
                continue  # plural forms have (msgid, n) keys; "" is the header
            if "\x04" in msgid:
                msgid = msgid.split("\x04", 1)[1]  # drop the msgctxt
            if "\n" in msgid or "\n" in msgstr or not 2 <= len(msgid) <= 120 or not msgstr.strip():
                continue
            if msgid in seen or msgid == msgstr:
                continue
            seen.add(msgid)
            rows.append({"source": msgid, "target": msgstr})
    return rows


def debian_packages() -> list[dict[str, str]]:
    """Package, Section, summary and long description of every package apt knows."""
    try:
        text = subprocess.run(["apt-cache", "dumpavail"], capture_output=True, text=True,
                              check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        text = ""
    if text.count("\nPackage:") < 1000:
        text = Path("/var/lib/dpkg/status").read_text(errors="replace")
    packages, seen = [], set()
    for stanza in text.split("\n\n"):
        fields: dict[str, str] = {}
        key = None
        for line in stanza.splitlines():
            if line.startswith((" ", "\t")) and key:
                fields[key] += "\n" + line[1:]
            elif ":" in line:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
        name, section = fields.get("Package"), fields.get("Section")
        description = fields.get("Description") or fields.get("Description-en")
        if not (name and section and description) or name in seen:
            continue
        seen.add(name)
        summary, _, long = description.partition("\n")
        long = "\n".join("" if line.strip() == "." else line.strip() for line in long.splitlines())
        paragraphs = [re.sub(r"\s+", " ", p).strip() for p in long.split("\n\n")]
        paragraphs = [p for p in paragraphs if p]
        packages.append({"name": name, "section": section.split("/")[-1], "summary": summary.strip(),
                         "long": paragraphs})
    return packages


# Groff escapes and the inline macros whose arguments are prose (the rest of a "." line is markup).
_ESCAPES = re.compile(r"\\f(\[[^\]]*\]|\(..|.)|\\s[-+]?\d|\\\*(\(..|\[[^\]]*\]|.)|\\\(..|"
                      r"\\\[[^\]]*\]|\\[&|^~%:0/,!cdeEpt ]")
_PROSE_MACROS = re.compile(r"[.'](B|I|BR|IR|RB|RI|BI|IB|SM|SB|Nm|Fn|Xr|Ar|Fl|Pa|Va|Dv|Er|Ev|Sy|Em|"
                           r"Li|Cm|It|Dq|Sq|Ql)\s+(.*)")
MAN_SECTIONS = "123578"  # 4 (devices) and 6 (games) have too few pages here
MAN_CAP = 3000


def man_description(path: str, limit: int = 6000, whole: bool = False) -> str | None:
    """The DESCRIPTION section of a gzipped man page as plain prose (markup dropped), or None;
    `whole`: every section but NAME (SYNOPSIS first, SEE ALSO near the end), headings dropped."""
    try:
        raw = gzip.open(path, "rt", errors="replace").read()
    except OSError:
        return None
    lines, inside = [], False
    for line in raw.splitlines():
        if line.startswith((".SH", ".Sh")):
            heading = line[3:].strip().strip('"').upper()
            inside = not heading.startswith("NAME") if whole else heading.startswith("DESCRIPTION")
            continue
        if not inside:
            continue
        if line.startswith((".", "'")):
            macro = _PROSE_MACROS.match(line)
            if not macro:
                continue
            line = macro.group(2).replace('"', "")
        # special characters (\(em, \[em]) become a space, font and size changes nothing
        line = _ESCAPES.sub(lambda m: " " if m.group(0)[1] in "([" else "",
                            line.replace("\\-", "-")).replace("\\e", "\\").strip()
        if line:
            lines.append(line)
        if sum(map(len, lines)) > limit:
            break
    text = re.sub(r"\s+", " ", " ".join(lines)).strip()
    return text if len(text.split()) >= 8 else None


def man_sections(rng: random.Random) -> list[dict[str, str]]:
    """Man pages' DESCRIPTION -> their section (man1 user commands, man3 library calls, ...).
    The Google Cloud SDK's thousands of generated pages (gcloud, gsutil, bq) are left out."""
    rows = []
    for section in MAN_SECTIONS:
        pages = sorted(glob.glob(f"/usr/share/man/man{section}/*.gz"))
        rng.shuffle(pages)
        pages = [p for p in pages if not re.search(r"/(gcloud|gsutil|bq)[_.-]", p)]
        texts = (man_description(p) for p in pages)
        rows += [{"text": t, "label": f"man{section}"} for t in texts if t][:MAN_CAP]
    rng.shuffle(rows)
    return rows


def man_pages(rng: random.Random, per_section: int = 1000) -> list[dict[str, str]]:
    """Whole man pages (every section but NAME, at most 20,000 characters) -> their section: long
    texts whose evidence is spread through them (a SYNOPSIS's #include at the start, SEE ALSO's
    "(2)" and "(3)" at the end), for --long windows against cut."""
    rows = []
    for section in MAN_SECTIONS:
        pages = sorted(glob.glob(f"/usr/share/man/man{section}/*.gz"))
        rng.shuffle(pages)
        pages = [p for p in pages if not re.search(r"/(gcloud|gsutil|bq)[_.-]", p)]
        texts = (man_description(p, limit=20000, whole=True) for p in pages)
        rows += [{"text": t, "label": f"man{section}"} for t in texts if t][:per_section]
    rng.shuffle(rows)
    return rows


def _capped(rows: list[dict[str, str]], cap: int) -> list[dict[str, str]]:
    """The first `cap` rows of each label."""
    seen: Counter = Counter()
    kept = []
    for row in rows:
        seen[row["label"]] += 1
        if seen[row["label"]] <= cap:
            kept.append(row)
    return kept


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="data", help="output folder (default: data/)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", default=None, metavar="NAMES",
                        help=f"build only these (comma-separated: {', '.join(NAMES)}); default: all")
    args = parser.parse_args()
    only = set(NAMES) if args.only is None else {n.strip() for n in args.only.split(",") if n.strip()}
    if not only or only - set(NAMES):
        parser.error(f"--only: expected some of {', '.join(NAMES)}, got {args.only!r}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)

    # One seeded generator, drawn in this order: a file is the same whatever --only leaves out
    # (what comes before it is built, not written).
    pairs = gettext_pairs("de")
    rng.shuffle(pairs)
    if "en_de" in only:
        _write(out / "en_de.jsonl", pairs)
    if only <= {"en_de"}:
        return

    packages = debian_packages()
    counts = Counter(p["section"] for p in packages)
    keep = {s for s, _ in counts.most_common(LABELS)}
    rng.shuffle(packages)
    per_label: Counter = Counter()
    labelled = []
    for p in packages:
        if p["section"] in keep and per_label[p["section"]] < PER_LABEL_CAP:
            per_label[p["section"]] += 1
            labelled.append({"text": p["summary"], "label": p["section"]})
    if "debian_sections" in only:
        _write(out / "debian_sections.jsonl", labelled)
        print("labels:", ", ".join(f"{s} {n}" for s, n in per_label.most_common()))
    # The same packages with their whole description: long texts, for the --max-length choice.
    described = [{"text": " ".join([p["summary"], *p["long"]]), "label": p["section"]}
                 for p in packages if p["section"] in keep and p["long"]]
    if "debian_described" not in only:
        pass
    elif len(described) >= 1000:  # apt's package lists hold summaries only; dpkg's status has all
        _write(out / "debian_described.jsonl", _capped(described, PER_LABEL_CAP))
    else:
        print(f"debian_described.jsonl: not written (only {len(described)} packages here have a "
              "long description)")
    if "man_pages" in only:  # (a generator of its own: the files above are the same without it)
        _write(out / "man_pages.jsonl", man_pages(random.Random(f"{args.seed}/man_pages")))
    if not only & {"man_sections", "en_fr_pairs"}:
        return
    man = man_sections(rng)
    if "man_sections" in only:
        _write(out / "man_sections.jsonl", man)
    if "en_fr_pairs" in only:
        fr = gettext_pairs("fr")
        rng.shuffle(fr)
        _write(out / "en_fr_pairs.jsonl", [{"anchor": r["source"], "positive": r["target"]} for r in fr])


def _write(path: Path, rows: list[dict[str, str]]) -> None:
    with path.open("w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    print(f"{path}: {len(rows)} records")


if __name__ == "__main__":
    main()
