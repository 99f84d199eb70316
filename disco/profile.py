"""This machine's cost profile: what a target pass costs against the tokens it verifies, what an assistant step
costs in each precision, how often drafts are accepted, and so which lookahead pays here.

``python -m disco profile`` prints it (``--json`` for the schema below, ``--csv`` for the per-pass costs); the app
measures it in the background after start-up and shows it in its "This machine" tab. Cached on disk per machine
key (``disco.calibration.machine_key``) + dtype + prompts + length, so it is measured once per machine.

What it measures, on the real models:
  * target: one pass over n = 1..33 tokens on top of a ~40-token cache (verification of n - 1 drafts), and a
    prefill of the prompts' lengths (iteration 1 feeds the prompt and the first drafts in one pass);
  * assistant: one step (1-3 tokens on top of its cache) and a prefill, for each assistant precision;
  * acceptance: exact greedy replay (``disco.replay``) of a grid of static K and threshold settings over a few
    suite prompts, per assistant precision. Replay gives each setting's iterations exactly; its time is the
    measured per-pass costs above. The best settings become the recommendation and the app's ``auto`` lane.
Leviathan et al.'s prediction is shown beside it with the *measured* verification cost T(K+1) instead of a flat
one: speed-up(K) = E[tokens | alpha, K] * T(1) / (T(K+1) + K * A(1)).
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from disco import calibration as cal_mod
from disco import precision as prec
from disco.calibration import expected_tokens, interpolate, pass_costs

FORMAT = 1
VERIFY_SIZES = tuple(range(1, 34))
ASSISTANT_SIZES = (1, 2, 3)
STATIC_GRID = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 20)
TAU_GRID = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
KMAX_GRID = (5, 10, 20)
REFERENCE = "threshold:0.4:20"
DEFAULT_PROMPTS = ("code-binary-search", "explain-kv-cache", "code-complete-fib")
DEFAULT_TOKENS = 32


class ProfileError(RuntimeError):
    """A profile that cannot be measured or read (one line for the user)."""


def grid() -> list[str]:
    specs = ["autoregressive"] + [f"static:{k}" for k in STATIC_GRID]
    specs += [f"threshold:{t:g}:{k}" for k in KMAX_GRID for t in TAU_GRID]
    return specs


@dataclass
class Profile:
    key: dict
    dtype: str
    decision: dict | None                       # the calibration that chose dtype and assistant (see calibration)
    target_ms: dict[int, float]                 # tokens fed on top of the cache -> ms
    target_prefill_ms: dict[int, float]         # fresh cache, prompt-sized passes
    assistant_ms: dict[str, dict[int, float]]   # precision -> tokens -> ms
    assistant_prefill_ms: dict[str, dict[int, float]]
    acceptance: dict[str, float] = field(default_factory=dict)     # precision -> alpha (first-token agreement)
    replay: dict[str, dict[str, float]] = field(default_factory=dict)  # precision -> spec -> geomean speed-up
    prompts: list[str] = field(default_factory=list)
    max_new_tokens: int = DEFAULT_TOKENS
    recommended: dict = field(default_factory=dict)
    seconds: float = 0.0
    measured_at: str = ""
    format: int = FORMAT

    # -- derived numbers (pure) -------------------------------------------------------------------

    @property
    def precisions(self) -> list[str]:
        return list(self.assistant_ms)

    def cost_ratio(self, precision: str) -> float:
        """c = one assistant step / one target step (Leviathan et al.)."""
        return self.assistant_ms[precision][1] / self.target_ms[1]

    def cost_model(self, precision: str):
        """The replay cost model for one assistant precision (verification + prefill points)."""
        from disco.costs import CostModel

        target = {**self.target_ms, **self.target_prefill_ms}
        assistant = {**self.assistant_ms[precision], **self.assistant_prefill_ms.get(precision, {})}
        meta = {"source": "profile", "dtype": self.dtype, "assistant_precision": precision, **self.key}
        return CostModel(sorted(target.items()), sorted(assistant.items()), meta)

    def leviathan(self, precision: str, max_k: int = 32) -> list[dict]:
        """Predicted speed-up per static K with the measured verification cost, and with a flat one."""
        alpha = self.acceptance.get(precision, math.nan)
        t1, a1 = self.target_ms[1], self.assistant_ms[precision][1]
        rows = []
        for k in range(1, max_k + 1):
            tokens = expected_tokens(alpha, k) if alpha == alpha else math.nan
            measured = tokens * t1 / (interpolate(self.target_ms, k + 1) + k * a1)
            flat = tokens / (1.0 + k * a1 / t1)
            rows.append({"k": k, "verify_ratio": interpolate(self.target_ms, k + 1) / t1, "tokens": tokens,
                         "speedup_measured_verify": measured, "speedup_flat_verify": flat})
        return rows

    def recommend(self) -> dict:
        """Best static K and best threshold setting per precision (replay), the reference, and the overall best."""
        out: dict = {"by_precision": {}}
        overall = None
        for p, table in self.replay.items():
            statics = {s: v for s, v in table.items() if s.startswith("static:") and v == v}
            thresholds = {s: v for s, v in table.items() if s.startswith("threshold:") and v == v}
            entry = {}
            if statics:
                s = max(statics, key=statics.get)
                entry.update(static=s, static_speedup=statics[s])
            if thresholds:
                t = max(thresholds, key=thresholds.get)
                entry.update(threshold=t, threshold_speedup=thresholds[t])
            entry["reference_speedup"] = table.get(REFERENCE, math.nan)
            lev = self.leviathan(p, max(STATIC_GRID))
            best_k = max(lev, key=lambda r: r["speedup_measured_verify"])
            entry.update(leviathan_k=best_k["k"], leviathan_speedup=best_k["speedup_measured_verify"])
            out["by_precision"][p] = entry
            for spec, value in list(statics.items()) + list(thresholds.items()):
                if overall is None or value > overall[1]:
                    overall = (f"{spec}@{p}", value)
        if overall is not None:
            # where no speculative setting beats the target alone, the recommendation is the target alone
            pays = overall[1] > 1.0
            out["best_speculative"], out["best_speculative_speedup"] = overall
            out["auto"], out["auto_speedup"] = overall if pays else ("autoregressive", 1.0)
            out["speculation_pays"] = pays
        return out

    # -- serialisation ----------------------------------------------------------------------------

    def to_dict(self) -> dict:
        data = asdict(self)
        for name in ("target_ms", "target_prefill_ms"):
            data[name] = {str(n): v for n, v in getattr(self, name).items()}
        for name in ("assistant_ms", "assistant_prefill_ms"):
            data[name] = {p: {str(n): v for n, v in d.items()} for p, d in getattr(self, name).items()}
        data["cost_ratio"] = {p: self.cost_ratio(p) for p in self.precisions}
        data["leviathan"] = {p: self.leviathan(p) for p in self.precisions}
        data["machine"] = cal_mod.flags_line(self.key)
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "Profile":
        if data.get("format") != FORMAT:
            raise ProfileError(f"profile format {data.get('format')!r} is not {FORMAT}")
        ints = lambda d: {int(n): float(v) for n, v in d.items()}
        prof = cls(
            key=dict(data["key"]), dtype=data["dtype"], decision=data.get("decision"),
            target_ms=ints(data["target_ms"]), target_prefill_ms=ints(data.get("target_prefill_ms", {})),
            assistant_ms={p: ints(d) for p, d in data["assistant_ms"].items()},
            assistant_prefill_ms={p: ints(d) for p, d in data.get("assistant_prefill_ms", {}).items()},
            acceptance={p: float(v) for p, v in data.get("acceptance", {}).items()},
            replay={p: {s: float(v) for s, v in d.items()} for p, d in data.get("replay", {}).items()},
            prompts=list(data.get("prompts", [])), max_new_tokens=int(data.get("max_new_tokens", DEFAULT_TOKENS)),
            recommended=dict(data.get("recommended", {})), seconds=float(data.get("seconds", 0.0)),
            measured_at=data.get("measured_at", ""),
        )
        if prof.replay:  # the recommendation follows from the measurements: re-derive it (the rule may have changed)
            prof.recommended = prof.recommend()
        return prof

    def cost_rows(self) -> list[dict]:
        """Per-pass costs as rows (``profile --csv``): role, precision, tokens, kind (step | prefill), ms."""
        rows = [{"role": "target", "precision": self.dtype, "kind": "step", "tokens": n, "ms": v}
                for n, v in sorted(self.target_ms.items())]
        rows += [{"role": "target", "precision": self.dtype, "kind": "prefill", "tokens": n, "ms": v}
                 for n, v in sorted(self.target_prefill_ms.items())]
        for p in self.precisions:
            rows += [{"role": "assistant", "precision": p, "kind": "step", "tokens": n, "ms": v}
                     for n, v in sorted(self.assistant_ms[p].items())]
            rows += [{"role": "assistant", "precision": p, "kind": "prefill", "tokens": n, "ms": v}
                     for n, v in sorted(self.assistant_prefill_ms.get(p, {}).items())]
        return rows


# ---------------------------------------------------------------------------------------------
# measuring


def _prefill_ms(model, device, ids: list[int], reps: int) -> float:
    import statistics

    import torch
    from transformers import DynamicCache

    samples = []
    with torch.inference_mode():
        for _ in range(reps):
            start = time.perf_counter()
            model(input_ids=torch.tensor([ids], device=device), cache=DynamicCache(config=model.config),
                  use_cache=True, logits_to_keep=1)
            samples.append((time.perf_counter() - start) * 1000.0)
    return statistics.median(samples)


def suite_prompts(ids=DEFAULT_PROMPTS):
    from disco.suite import load_suite

    suite = {p.id: p for p in load_suite()}
    missing = [i for i in ids if i not in suite]
    if missing:
        raise ProfileError(f"unknown suite prompt(s): {', '.join(missing)}")
    return [suite[i] for i in ids]


def measure(pair, models: str, prompts=DEFAULT_PROMPTS, max_new_tokens: int = DEFAULT_TOKENS, reps: int = 3,
            precisions=None, table_dir: Path | None = None, log=None, lock=None, should_stop=None) -> Profile:
    """Measure the profile (see the module doc). ``lock`` (a context manager) is held around each chunk of
    work and released between them, so a user's run waits at most one chunk; ``should_stop`` is polled between
    chunks (raises ``disco.engine.Interrupted``)."""
    from disco.engine import Interrupted
    from disco.race import encode_prompt
    from disco.replay import build_table, replay_many

    start = time.perf_counter()
    say = log or (lambda _msg: None)
    guard = lock if lock is not None else contextlib.nullcontext()
    if precisions is None:
        precisions = [prec.MODEL] + ([prec.INT8] if pair.device.type == "cpu" else [])

    def chunk():
        if should_stop is not None and should_stop():
            raise Interrupted("profile")
        return guard

    chosen = suite_prompts(prompts)
    encoded = {p.id: encode_prompt(pair, p.prompt, p.chat, max_new_tokens) for p in chosen}
    lengths = sorted(len(v) for v in encoded.values())
    prefill_sizes = sorted({max(len(VERIFY_SIZES) + 1, lengths[0]), lengths[-1] + max(KMAX_GRID) + 1})
    ctx = cal_mod._context(pair)
    views = {p: pair.with_assistant(p) for p in precisions}
    with chunk():
        for view in views.values():
            view.warmup()
        say(f"target: a pass over 1..{len(VERIFY_SIZES)} tokens, {reps} times each ...")
    target_ms: dict[int, float] = {}
    for lo in range(0, len(VERIFY_SIZES), 4):  # four sizes per chunk: a queued run waits ~2 s at most
        with chunk():
            target_ms.update(pass_costs(pair.target, pair.device, ctx, VERIFY_SIZES[lo:lo + 4], reps))
    with chunk():
        longest = max(encoded.values(), key=len)
        filler = (longest * (prefill_sizes[-1] // len(longest) + 1))
        target_prefill = {n: _prefill_ms(pair.target, pair.device, filler[:n], reps) for n in prefill_sizes}
    assistant_ms, assistant_prefill = {}, {}
    for p, view in views.items():
        with chunk():
            assistant_ms[p] = pass_costs(view.assistant, view.device, ctx, ASSISTANT_SIZES, reps + 2)
            assistant_prefill[p] = {n: _prefill_ms(view.assistant, view.device, filler[:n], reps) for n in prefill_sizes}
        say(f"assistant ({p}): {assistant_ms[p][1]:.0f} ms a step, c = {assistant_ms[p][1] / target_ms[1]:.2f}")
    profile = Profile(cal_mod.machine_key(models, pair.device), pair.dtype_name,
                      pair.calibration.to_dict() if getattr(pair, "calibration", None) is not None else None,
                      target_ms, target_prefill, assistant_ms, assistant_prefill, prompts=list(prompts),
                      max_new_tokens=max_new_tokens)
    specs = grid()
    for p, view in views.items():
        costs = profile.cost_model(p)
        speedups: dict[str, list[float]] = {s: [] for s in specs}
        hits = total = 0
        for prompt in chosen:
            say(f"acceptance ({p}): replaying {len(specs)} settings on {prompt.id} ...")
            with chunk():
                table = build_table(view, encoded[prompt.id], max_new_tokens, table_dir, name=prompt.id)
                results = replay_many(table, specs, max_new_tokens, costs)
                if table.dirty and table.path is not None:
                    table.save()
            h, t = table.first_token_agreement(max_new_tokens)
            hits, total = hits + h, total + t
            base = results["autoregressive"].summary()["seconds"]
            for s, res in results.items():
                speedups[s].append(base / res.summary()["seconds"])
        profile.acceptance[p] = hits / total if total else math.nan
        profile.replay[p] = {s: math.exp(sum(math.log(v) for v in vs) / len(vs)) for s, vs in speedups.items() if vs}
    profile.recommended = profile.recommend()
    profile.seconds = time.perf_counter() - start
    profile.measured_at = time.strftime("%Y-%m-%d %H:%M:%S")
    return profile


# ---------------------------------------------------------------------------------------------
# the cache


def path_for(key: dict, dtype: str, prompts, max_new_tokens: int, root=None) -> Path:
    blob = {"key": key, "dtype": dtype, "prompts": list(prompts), "tokens": max_new_tokens, "format": FORMAT}
    return cal_mod.cache_dir(root) / f"profile-{cal_mod.key_hash(blob)}.json"


def load_cached(models: str, pair, prompts=DEFAULT_PROMPTS, max_new_tokens: int = DEFAULT_TOKENS,
                root=None) -> Profile | None:
    key = cal_mod.machine_key(models, pair.device)
    path = path_for(key, pair.dtype_name, prompts, max_new_tokens, root)
    try:
        profile = Profile.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError, ProfileError):
        return None
    return profile if profile.key == key and profile.dtype == pair.dtype_name else None


def latest(models: str, pair, root=None) -> Profile | None:
    """The default profile for this machine and dtype, else the newest one measured with other prompts
    or length (``python -m disco profile --prompts ...``): what the ``auto`` lane uses."""
    found = load_cached(models, pair, root=root)
    if found is not None:
        return found
    key = cal_mod.machine_key(models, pair.device)
    best = None
    for path in cal_mod.cache_dir(root).glob("profile-*.json"):
        try:
            prof = Profile.from_dict(json.loads(path.read_text()))
        except (OSError, ValueError, KeyError, TypeError, ProfileError):
            continue
        if prof.key == key and prof.dtype == pair.dtype_name and (best is None or prof.measured_at > best.measured_at):
            best = prof
    return best


def save(profile: Profile, root=None) -> Path | None:
    path = path_for(profile.key, profile.dtype, profile.prompts, profile.max_new_tokens, root)
    return cal_mod.write_json(path, profile.to_dict())


def get(pair, models: str, refresh: bool = False, root=None, **kwargs) -> Profile:
    """The cached profile, or a fresh measurement (then cached)."""
    prompts = kwargs.get("prompts", DEFAULT_PROMPTS)
    tokens = kwargs.get("max_new_tokens", DEFAULT_TOKENS)
    if not refresh:
        cached = load_cached(models, pair, prompts, tokens, root)
        if cached is not None:
            return cached
    profile = measure(pair, models, **kwargs)
    save(profile, root)
    return profile


def resolve_auto(spec: str, profile: Profile | None) -> str:
    """The ``auto`` lane's spec: the profile's overall best setting (with its assistant precision)."""
    if profile is None or "auto" not in profile.recommended:
        raise ProfileError("the 'auto' lane needs this machine's profile, which is not measured yet "
                           "(python -m disco profile measures it; the app does so in the background)")
    return profile.recommended["auto"]
