"""`adaptive` against transformers' adaptive generate on the suite's 6 timed prompts: text and passes must be equal.

Usage: PYTHONPATH=. .venv/bin/python scripts/check_adaptive.py {model,int8} MAX_NEW_TOKENS
"""
import sys

from disco.bench.peer import run_hf, run_ours
from disco.suites import load_suite, pick_prompts
from disco.models import encode_prompt, load_pair, resolve_assistant
from disco.policies import parse_strategy

prec = sys.argv[1]; n = int(sys.argv[2])
pair = resolve_assistant(load_pair("embedded", dtype="bf16"), prec)
for p in pick_prompts(list(load_suite().prompts), 6):
    ids = encode_prompt(pair, p.prompt, p.chat, n)
    for spec in ["adaptive:0.4:20", "adaptive:0.6:5"]:
        policy = parse_strategy(spec)
        a = run_ours(pair, ids, policy, n); h = run_hf(pair, ids, policy, n)
        taus = [round(r.threshold, 3) for r in a["records"]]
        print(p.id, spec, "text_identical", a["output_ids"] == h["output_ids"], "target_passes", a["summary"]["target_calls"], h["target_passes"],
              "assistant_passes", a["summary"]["draft_calls"], h["assistant_passes"], "tau", taus[:3], "...", taus[-1], flush=True)
