"""WritingBench (Wu et al., 2025): writing requests in many genres; measured for speed only (Section 4.1).

- Data: no hub copy this harness knows: ``benchmark_query/benchmark_all.jsonl`` of github.com/X-PLUG/WritingBench,
  given with ``--data`` (``query``, and ``lang`` or ``language`` where the record has one). The paper keeps the
  555 English queries of its 1,239 (:func:`english`).
- Prompt: the query itself, never truncated (E.3), in the tokenizer's chat template at T > 0; output cap 512
  tokens (E.2).
- Stops: none beyond the model's end markers.
- Grader and metric: none (tokens/NFE and throughput only).
"""

from __future__ import annotations

import re

from packed_ss.evals.task import Task

FULL, ENGLISH = 1239, 555  # queries in benchmark_all.jsonl; the paper's English ones
CJK = re.compile(r"[\u3040-\u30ff\u3400-\u9fff\uac00-\ud7af\uf900-\ufaff\uff00-\uffef]")


def prompt(record: dict) -> str:
    """WritingBench: the query itself, never truncated (E.3)."""
    return record["query"]


def english(record: dict) -> bool:
    """WritingBench's English queries: by the record's own language field where it has one, else by script
    (no Chinese, Japanese or Korean characters in the query)."""
    lang = record.get("lang", record.get("language"))
    if lang not in (None, ""):
        return str(lang).strip().lower() in ("en", "english")
    return not CJK.search(str(record.get("query", "")))


def data_note(read: int, kept: int) -> str:
    """The English count against the paper's, for the whole benchmark file ("" for any other file)."""
    if read != FULL:
        return ""
    return f"{kept} English queries of {read}" + ("" if kept == ENGLISH else f"; the paper has {ENGLISH}")


TASK = Task("writingbench", "", None, "test", ENGLISH, 512, prompt, None, fields=(("query", str),), keep=english,
            chat_sampled=True, data_note=data_note,
            note="WritingBench has no hub dataset this harness knows: download benchmark_query/benchmark_all.jsonl "
                 "from github.com/X-PLUG/WritingBench and give it with --data")
