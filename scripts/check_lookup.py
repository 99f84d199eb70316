"""`lookup:K:N` against transformers' own prompt-lookup generate (`prompt_lookup_num_tokens=K`,
`max_matching_ngram_size=N`) on every prompt of the suite: the text and the number of target passes must be equal.

Usage: PYTHONPATH=. .venv/bin/python scripts/check_lookup.py MAX_NEW_TOKENS SPEC [SPEC ...]
(the embedded pair on the torch engine: transformers' generate needs transformers models)
"""
import sys

from disco.bench.peer import run_hf, run_ours
from disco.suites import load_suite
from disco.models import encode_prompt, load_pair
from disco.policies import parse_strategy

n, specs = int(sys.argv[1]), sys.argv[2:] or ["lookup:10:2"]
pair = load_pair("embedded", engine="torch")
equal = total = 0
for p in load_suite().prompts:
    ids = encode_prompt(pair, p.prompt, p.chat, n)
    for spec in specs:
        ours, hf = run_ours(pair, ids, parse_strategy(spec), n), run_hf(pair, ids, parse_strategy(spec), n)
        same = ours["output_ids"] == hf["output_ids"] and ours["summary"]["target_calls"] == hf["target_passes"]
        equal, total = equal + same, total + 1
        print(p.id, spec, "text_identical", ours["output_ids"] == hf["output_ids"], "target_passes",
              ours["summary"]["target_calls"], hf["target_passes"], "accepted", ours["summary"]["accepted"], flush=True)
print(f"equal text and target passes: {equal} of {total} runs ({pair.dtype_name}, {pair.device_name})")
