"""Example responses side by side, the departures from the baseline marked: paper Table 3 (§7.3.1), in each
fidelity group of the fidelity section (fidelity.py), from the runs' samples.jsonl (runners/splitee/fidelity.py).

Which prompts. They are chosen once per group, on one reference configuration, so every configuration is
shown on the same prompts:

- the reference is `epn` when it diverges from the baseline on any prompt (the paper's Table 3 shows EPN),
  else the configuration diverging on the most prompts (ties: the lower mean token match, then the group's
  row order); `n_diverging` and `token_match_rate` of results.json decide, so no samples file is read for it
  (a configuration without samples lines is passed over for the next in that order);
- on the reference's samples (workload order): the **first** prompt; the prompt of **median first
  divergence** among its diverging prompts (sorted by first divergence then workload order; the lower middle
  one of an even count); the **worst** prompt: earliest divergence, ties to the lowest token match, then
  workload order. A prompt that fills two roles is shown once, under both; with no diverging prompt only the
  first is shown.

What is shown. For each prompt: the prompt, the baseline's response, then every configuration of the group in
the group's row order (ep1 at each ε). A response is compared with its own run's baseline word by word
(whitespace-separated, difflib): words it shares with the baseline are plain; from its first differing word
on, its words are in <mark>, except runs of at least `RESYNC` words that match the baseline again (greedy
decoding often falls back into the baseline's wording), which are plain; baseline words it drops with nothing
in their place are struck through (<del>). A response identical to the baseline is not repeated. Each
response shows at most `WORDS` words ("…" where cut); when every response agrees with the baseline beyond
that, the shown window starts `CONTEXT` words before the earliest departure (a leading "…": the words left
out are identical in every response).

Rendering. One HTML <table> per prompt (GitHub renders HTML inside markdown; a table cell holds no markdown,
so model text needs only HTML escaping): the text is `html.escape`d, "|" written as &#124;, line breaks as
<br>, and no blank line falls inside the block (a blank line would end GitHub's HTML block).

Reading stays cheap: the reference's samples.jsonl is read once keeping three fields a line, then each run's
file keeps only the chosen prompts' lines. With several lines for a prompt (several mask seeds), the first
is used (its seed is named).
"""
from __future__ import annotations

import difflib
import html
import json
import re
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.results import SAMPLES
from runners.report.format import num
from runners.report.splitee.fidelity_rows import FidelityGroup, FidelityRow

HEADING = "#### Example responses (paper Table 3)"
REFERENCE = "epn"    # the paper's Table 3 configuration, preferred as the reference when it diverges
WORDS = 80           # words shown per response (and of the prompt)
CONTEXT = 12         # baseline-identical words kept before the earliest departure when the window moves on
RESYNC = 3           # a run of at least this many words matching the baseline again is shown plain


# ---------------------------------------------------------------------------------------------------
# Choosing the prompts
# ---------------------------------------------------------------------------------------------------


@dataclass
class Pick:
    """One chosen prompt and why: the roles it fills on the reference configuration."""

    id: str
    roles: list[str] = field(default_factory=list)


def reference(group: FidelityGroup) -> list[FidelityRow]:
    """The group's rows in the order they are tried as the reference (the first whose samples.jsonl has
    lines is used): epn when it diverges on some prompt, then the rows by most diverging prompts, lower mean
    token match, row order."""
    def diverging(row: FidelityRow) -> float:
        return num(row.metrics.get("n_diverging")) or 0.0

    def key(item: tuple[int, FidelityRow]) -> tuple:
        i, row = item
        tm = num(row.metrics.get("token_match_rate"))
        return (row.configuration != REFERENCE or diverging(row) == 0, -diverging(row),
                tm if tm is not None else 101.0, i)

    return [row for _, row in sorted(enumerate(group.rows), key=key)]


def choose(index: Sequence[tuple[str, int | None, float | None]]) -> list[Pick]:
    """The prompts to show from the reference's (id, first divergence, token match) rows, in workload order:
    first, median first divergence among the diverging rows, worst (earliest divergence, ties to the
    lowest token match, then workload order). Distinct prompts, in that order; one prompt filling several
    roles is listed once with all of them."""
    if not index:
        return []
    picks: list[Pick] = []

    def add(pid: str, role: str) -> None:
        for p in picks:
            if p.id == pid:
                p.roles.append(role)
                return
        picks.append(Pick(pid, [role]))

    add(index[0][0], "first prompt")
    diverging = [(fd, i) for i, (_, fd, _) in enumerate(index) if fd is not None]
    if diverging:
        ordered = sorted(diverging)
        fd, i = ordered[(len(ordered) - 1) // 2]
        add(index[i][0], f"median divergence (token {fd})")
        _, _, i = min((fd, tm if tm is not None else 101.0, i) for i, (_, fd, tm) in enumerate(index)
                      if fd is not None)
        tm = index[i][2]
        add(index[i][0], f"worst (token {index[i][1]}" + (f", token match {tm:.0f}%)" if tm is not None else ")"))
    return picks


# ---------------------------------------------------------------------------------------------------
# Reading samples.jsonl
# ---------------------------------------------------------------------------------------------------


def _lines(path: Path) -> Iterable[dict[str, Any]]:
    """The JSON objects of a samples.jsonl; a missing file yields none, an unreadable line is skipped (a
    report never fails on a damaged side file)."""
    try:
        handle = path.open(encoding="utf-8")
    except OSError:
        return
    with handle:
        for line in handle:
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict) and "id" in row:
                yield row


def _int(value: Any) -> int | None:
    v = num(value)
    return None if v is None else int(v)


def index(path: Path) -> list[tuple[str, int | None, float | None]]:
    """(id, first_divergence, token_match_rate) of each prompt, in file order, first line per id."""
    seen: set[str] = set()
    out = []
    for row in _lines(path):
        pid = str(row["id"])
        if pid not in seen:
            seen.add(pid)
            out.append((pid, _int(row.get("first_divergence")), num(row.get("token_match_rate"))))
    return out


@dataclass
class Sample:
    id: str
    prompt: str
    baseline_text: str
    output_text: str
    first_divergence: int | None
    token_match_rate: float | None
    mask_seed: Any = None


def load(path: Path, ids: Iterable[str]) -> dict[str, Sample]:
    """The chosen prompts' lines of a samples.jsonl (the first line per id); every other line is dropped."""
    wanted = set(ids)
    out: dict[str, Sample] = {}
    for row in _lines(path):
        pid = str(row["id"])
        if pid in wanted and pid not in out:
            out[pid] = Sample(pid, str(row.get("prompt") or ""), str(row.get("baseline_text") or ""),
                              str(row.get("output_text") or ""), _int(row.get("first_divergence")),
                              num(row.get("token_match_rate")), row.get("mask_seed"))
    return out


# ---------------------------------------------------------------------------------------------------
# The word diff
# ---------------------------------------------------------------------------------------------------


def words(text: str) -> list[tuple[str, str]]:
    """(word, the whitespace after it) for each whitespace-separated word."""
    return [(m.group(1), m.group(2)) for m in re.finditer(r"(\S+)(\s*)", text)]


@dataclass
class Diff:
    """A response against the baseline, word by word: which of its words are departures, and which baseline
    words it drops before each of its positions (key len(words) = after its last word)."""

    words: list[tuple[str, str]]
    changed: list[bool]
    dropped: dict[int, list[str]]

    @property
    def first(self) -> int | None:
        """The response's first departing word (or position of a drop); None if it matches throughout."""
        marks = [j for j, c in enumerate(self.changed) if c] + list(self.dropped)
        return min(marks) if marks else None


def diff(baseline: str, response: str, resync: int = RESYNC) -> Diff:
    """The word diff of the module docstring: common prefix plain; after it, difflib's matching blocks of at
    least `resync` words plain, everything else a departure; baseline words removed without replacement
    recorded as dropped."""
    bw, rw = words(baseline), words(response)
    b, r = [w for w, _ in bw], [w for w, _ in rw]
    k = 0
    while k < min(len(b), len(r)) and b[k] == r[k]:
        k += 1
    changed = [False] * len(r)
    dropped: dict[int, list[str]] = {}
    if b == r:
        return Diff(rw, changed, dropped)
    ops = difflib.SequenceMatcher(None, b[k:], r[k:], autojunk=False).get_opcodes()
    # A short match after the divergence is coincidence ("the", "of"): merge it into the departure around it.
    merged: list[list[int]] = []   # [i1, i2, j1, j2] of departures, baseline/response word indices
    for tag, i1, i2, j1, j2 in ops:
        if tag == "equal" and i2 - i1 >= resync:
            continue
        if merged and merged[-1][1] == k + i1 and merged[-1][3] == k + j1:
            merged[-1][1], merged[-1][3] = k + i2, k + j2
        else:
            merged.append([k + i1, k + i2, k + j1, k + j2])
    for i1, i2, j1, j2 in merged:
        if j2 > j1:
            changed[j1:j2] = [True] * (j2 - j1)
        elif i2 > i1:
            dropped[j1] = b[i1:i2]
    return Diff(rw, changed, dropped)


def _space(ws: str) -> str:
    """Whitespace between two shown words: line breaks kept (at most two), anything else one space."""
    breaks = min(ws.count("\n"), 2)
    return "<br>" * breaks if breaks else " "


def escape(text: str) -> str:
    """Model text for an HTML cell inside markdown: HTML-escaped, '|' as an entity."""
    return html.escape(text, quote=False).replace("|", "&#124;")


def render(d: Diff, start: int = 0, limit: int = WORDS) -> str:
    """The response's words [start, start + limit) as HTML: each run of departing words in one <mark>,
    dropped baseline words in <del> where they fall, "…" where words are cut."""
    end = min(len(d.words), start + limit)
    out = ["… "] if start > 0 else []
    j = start
    while j < end:
        if j in d.dropped:
            out.append(f"<del>{escape(' '.join(d.dropped[j]))}</del> ")
        k = j + 1
        if d.changed[j]:
            while k < end and d.changed[k]:
                k += 1
            run = "".join(escape(w) + (_space(ws) if i + 1 < k else "") for i, (w, ws) in
                          enumerate(d.words[j:k], start=j))
            out.append(f"<mark>{run}</mark>")
        else:
            out.append(escape(d.words[j][0]))
        if k < end:
            out.append(_space(d.words[k - 1][1]))
        j = k
    if end == len(d.words) and end in d.dropped:
        out.append((" " if end > start else "") + f"<del>{escape(' '.join(d.dropped[end]))}</del>")
    if end < len(d.words):
        out.append(" …")
    return "".join(out)


def window_start(firsts: Iterable[int | None], limit: int = WORDS, context: int = CONTEXT) -> int:
    """Where every response's shown window starts: 0, unless the earliest departure lies beyond
    `limit - context` words; then `context` words before it (everything before is common to all)."""
    known = [f for f in firsts if f is not None]
    if not known or min(known) <= limit - context:
        return 0
    return min(known) - context


# ---------------------------------------------------------------------------------------------------
# The section
# ---------------------------------------------------------------------------------------------------


def _plain(text: str, limit: int = WORDS) -> str:
    """Text without marks (the prompt), first `limit` words."""
    ws = words(text)
    return render(Diff(ws, [False] * len(ws), {}), 0, limit)


def _status(s: Sample) -> str:
    if s.first_divergence is None:
        return "identical"
    tm = f" · token match {s.token_match_rate:.0f}%" if s.token_match_rate is not None else ""
    return f"diverges at token {s.first_divergence}{tm}"


def _table(group: FidelityGroup, pick: Pick, ref: Sample, samples: dict[int, Sample | None],
           files: dict[int, bool]) -> list[str]:
    rows = group.rows
    diffs: dict[int, Diff] = {}
    for i, s in samples.items():
        if s is not None and s.output_text != s.baseline_text:
            d = diff(s.baseline_text, s.output_text)
            if d.first is not None:   # else only whitespace differs: shown as the same words
                diffs[i] = d
    start = window_start(d.first for d in diffs.values())
    base_words = words(ref.baseline_text)
    base = render(Diff(base_words, [False] * len(base_words), {}), start)
    title = f"{escape(pick.id)} · {escape('; '.join(pick.roles))}"
    lines = ["<table>", f'<tr><th colspan="2" align="left">{title}</th></tr>',
             f"<tr><td><b>prompt</b></td><td>{_plain(ref.prompt)}</td></tr>",
             f"<tr><td><b>baseline</b> ({escape(str(group.baseline))})</td><td>{base}</td></tr>"]
    for i, row in enumerate(rows):
        label = f"<b>{escape(row.label(group.show_variant))}</b>"
        s = samples.get(i)
        if s is None:
            why = "no samples.jsonl" if not files.get(i) else "no sample for this prompt"
            lines.append(f"<tr><td>{label}</td><td><i>{why}</i></td></tr>")
            continue
        status = _status(s) + (f" · mask seed {escape(str(s.mask_seed))}" if s.mask_seed is not None else "")
        if i not in diffs:
            cell = "<i>identical to the baseline</i>" if s.first_divergence is None else \
                "<i>the baseline's words (the tokens or the whitespace differ)</i>"
        else:
            cell = render(diffs[i], start)
            if s.baseline_text != ref.baseline_text:
                cell += "<br><i>(marked against this run's own baseline, which differs from the one shown)</i>"
        lines.append(f"<tr><td>{label}<br><sub>{status}</sub></td><td>{cell}</td></tr>")
    lines.append("</table>")
    return lines


def markdown(group: FidelityGroup) -> list[str]:
    """The group's "Example responses (paper Table 3)" subsection."""
    md = [HEADING, ""]
    ref_row, idx = None, []
    order = reference(group)
    for row in order:
        idx = index(row.run.path / SAMPLES)
        if idx:
            ref_row = row
            break
    if ref_row is None:
        return md + ["No run of this group has per-prompt samples (samples.jsonl): no example responses.", ""]
    picks = choose(idx)
    wanted = [p.id for p in picks]
    files = {i: (row.run.path / SAMPLES).is_file() for i, row in enumerate(group.rows)}
    loaded = {i: load(row.run.path / SAMPLES, wanted) for i, row in enumerate(group.rows)}
    ref_i = group.rows.index(ref_row)
    fds = [fd for _, fd, _ in idx if fd is not None]
    count = f"{len(fds)}/{len(idx)} prompts" + (f", median first divergence at token {statistics.median_low(fds)}"
                                               if fds else "")
    if ref_row.configuration == REFERENCE:
        why = f"the paper's Table 3 configuration; it diverges on {count}"
    else:
        why = f"the configuration diverging on the most prompts, {count}"
        if any(r.configuration == REFERENCE for r in group.rows):
            why += f"; `{REFERENCE}` diverges on none"
    if ref_row is not order[0]:
        why += f"; {order.index(ref_row)} configuration(s) ahead of it in that rule have no samples"
    md += [f"Prompts chosen on **{ref_row.label(group.show_variant)}** ({why}): the first prompt, the prompt of "
           "median first divergence among the diverging ones, and the worst (earliest divergence, ties to the "
           "lowest token match). Every configuration of the table is shown on the same prompts, each against "
           "the baseline word by word: <mark>highlighted</mark> words depart from the baseline (from the first "
           f"differing word on, except stretches of {RESYNC}+ words that match the baseline again), "
           f"<del>struck</del> words are the baseline's, dropped. At most {WORDS} words a response; \"…\" marks "
           "a cut (at the start: words identical in every response). Token positions count generated tokens "
           "from 0.", ""]
    for pick in picks:
        ref = loaded[ref_i].get(pick.id)
        if ref is None:  # the index saw it, so only a file changing under the report gets here
            continue
        md += _table(group, pick, ref, {i: loaded[i].get(pick.id) for i in range(len(group.rows))}, files)
        md.append("")
    return md
