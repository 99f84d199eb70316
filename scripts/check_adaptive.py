"""`adaptive` against transformers' adaptive generate on the suite's 6 timed prompts: text and passes must be equal.

Usage: PYTHONPATH=. .venv/bin/python scripts/check_adaptive.py {model,int8} MAX_NEW_TOKENS
"""
import sys
from disco.models import load_pair, resolve_assistant
from disco.peer import run_ours, run_hf
from disco.race import encode_prompt
from disco.suite import load_suite, pick_prompts
prec = sys.argv[1]; n = int(sys.argv[2])
pair = resolve_assistant(load_pair("embedded", dtype="bf16"), prec)
for p in pick_prompts(load_suite(), 6):
    ids = encode_prompt(pair, p.prompt, p.chat, n)
    for spec in ["adaptive:0.4:20", "adaptive:0.6:5"]:
        a = run_ours(pair, ids, spec, n); h = run_hf(pair, ids, spec, n)
        taus = [round(r.threshold, 3) for r in a["records"]]
        print(p.id, spec, "text_identical", a["output_ids"] == h["output_ids"], "target_passes", a["summary"]["target_calls"], h["target_passes"],
              "assistant_passes", a["summary"]["draft_calls"], h["assistant_passes"], "tau", taus[:3], "...", taus[-1], flush=True)
