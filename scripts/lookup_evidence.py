"""How well a prompt-lookup match's *evidence* predicts that its first copied token is accepted (the `copy` rule's
justification), from cached replay tables: at every output position of the chosen split, transformers' match
(`disco.policies.lookup.find_match`, n-gram 2) is looked up in prompt + output so far; its evidence is how many tokens
agree backwards from the matched place; the copied token is accepted when it is the target's own next token.

Usage: PYTHONPATH=. .venv/bin/python scripts/lookup_evidence.py TABLE_DIR [train|test|all]
(TABLE_DIR: a bench --cache-dir; only tables of suite prompts are read; no model is loaded)
"""
import json
import sys
from collections import defaultdict
from pathlib import Path

from disco.suites import load_suite, split_prompts
from disco.policies.lookup import NGRAM_DEFAULT, evidence, find_match
from disco.replay.tables import cached_table_paths

folder, split = Path(sys.argv[1]), (sys.argv[2] if len(sys.argv) > 2 else "train")
buckets = defaultdict(lambda: [0, 0])  # evidence -> [reached, accepted]
tables, seen = 0, set()
for prompt in split_prompts(list(load_suite().prompts), split):
    for path in cached_table_paths(folder, prompt.id):
        data = json.loads(path.read_text())
        ids, ref = list(data["prompt_ids"]), list(data["reference"])
        if (tuple(ids), tuple(ref)) in seen:  # one table per assistant precision: the same target output
            continue
        seen.add((tuple(ids), tuple(ref)))
        tables += 1
        for p in range(len(ref)):
            context = ids + ref[:p]
            match = find_match(context, NGRAM_DEFAULT)
            if match is None:
                continue
            e = min(evidence(context, match[0]), 8)
            buckets[e][0] += 1
            buckets[e][1] += context[match[0]] == ref[p]
print(f"{tables} tables ({split} split) in {folder}")
print("evidence  matches  first copied token accepted")
for e in sorted(buckets):
    n, ok = buckets[e]
    print(f"{e if e < 8 else '8+':>8}  {n:7d}  {ok / n:6.1%}")
