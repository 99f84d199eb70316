"""This machine's cost profile as data: what a target pass costs against the tokens it verifies, what an assistant
step costs in each precision, how often drafts are accepted, and so which lookahead pays here.

It is measured by ``disco.bench.machine_profile`` (``python -m disco profile``; the app does so in the background
for its "This machine" tab and its ``auto`` lane). This module holds the record, what follows from its numbers
(pure), and its cache: one file per machine key (``disco.models.keys.machine_key``) + dtype + prompts + length in
``disco.cache.machine_dir()``, so it is measured once per machine.

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

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from disco import cache
from disco.costs import engines
from disco.costs.model import CostModel
from disco.errors import UserError
from disco.machine import flags_line, key_hash
from disco.models.keys import machine_key
from disco.models.timing import interpolate
from disco.policies import REFERENCE, STATIC_KS, export, parse_strategy, spec_kind, split_precision
from disco.theory import expected_tokens

FORMAT = 1
DEFAULT_PROMPTS = ("code-binary-search", "explain-kv-cache", "code-complete-fib")
DEFAULT_TOKENS = 32


class ProfileError(UserError, RuntimeError):
    """A profile that cannot be measured or read (one line for the user)."""


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
    preliminary: bool = False  # a quick first measurement (fewer sizes, one prompt), refined by a full one

    # -- derived numbers (pure) -------------------------------------------------------------------

    @property
    def precisions(self) -> list[str]:
        return list(self.assistant_ms)

    def cost_ratio(self, precision: str) -> float:
        """c = one assistant step / one target step (Leviathan et al.)."""
        return self.assistant_ms[precision][1] / self.target_ms[1]

    def cost_model(self, precision: str):
        """The replay cost model for one assistant precision (verification + prefill points)."""
        target = {**self.target_ms, **self.target_prefill_ms}
        assistant = {**self.assistant_ms[precision], **self.assistant_prefill_ms.get(precision, {})}
        meta = {"source": "profile", "dtype": self.dtype, "assistant_precision": precision, **self.key}
        return CostModel(sorted(target.items()), sorted(assistant.items()), meta)

    def cost_model_near(self, precision: str | None):
        """``cost_model`` of ``precision`` where this profile measured it, else of its first assistant."""
        return self.cost_model(precision if precision in self.precisions else self.precisions[0])

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

    def batch_table(self, precision: str, max_k: int = 16, batches=(1, 2, 4, 8, 16, 32, 64)) -> list[list[int]]:
        """vLLM's ``num_speculative_tokens_per_batch_size`` for a static K, *modelled* from this profile: B requests
        verifying K + 1 tokens each are costed as one target pass of B(K + 1) tokens on this machine and B assistant
        tokens per draft step (attention aside), with Leviathan's expected tokens at the measured acceptance. Rows
        ``[first, last, K]`` (K = 0: speculation off), only as far as the measured pass sizes reach."""
        alpha = self.acceptance.get(precision, math.nan)
        if alpha != alpha or precision not in self.assistant_ms:
            return []
        target = {**self.target_ms, **self.target_prefill_ms}
        assistant = {**self.assistant_ms[precision], **self.assistant_prefill_ms.get(precision, {})}
        largest = max(target)
        best = []
        for b in batches:
            if b > largest:
                break
            step = interpolate(target, b)
            gains = {k: expected_tokens(alpha, k) * step / (interpolate(target, b * (k + 1)) + k * interpolate(assistant, b))
                     for k in range(1, max_k + 1) if b * (k + 1) <= largest}
            if not gains:  # no verification this large was measured: the table ends (0 would claim "off")
                break
            k = max(gains, key=gains.get)
            best.append((b, k if gains[k] > 1.0 else 0))
        rows: list[list[int]] = []
        for i, (b, k) in enumerate(best):
            last = best[i + 1][0] - 1 if i + 1 < len(best) else b
            if rows and rows[-1][2] == k:
                rows[-1][1] = last
            else:
                rows.append([b, last, k])
        return rows

    def recommend(self) -> dict:
        """Best static K and best threshold setting per precision (replay), the reference, and the overall best."""
        out: dict = {"by_precision": {}}
        overall = None
        for p, table in self.replay.items():
            statics = {s: v for s, v in table.items() if spec_kind(s) == "static" and v == v}
            thresholds = {s: v for s, v in table.items() if spec_kind(s) == "threshold" and v == v}
            entry = {}
            if statics:
                s = max(statics, key=statics.get)
                entry.update(static=s, static_speedup=statics[s])
            if thresholds:
                t = max(thresholds, key=thresholds.get)
                entry.update(threshold=t, threshold_speedup=thresholds[t])
            entry["reference_speedup"] = table.get(REFERENCE, math.nan)
            lev = self.leviathan(p, max(STATIC_KS))
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
        data["machine"] = flags_line(self.key)
        data["take_away"] = self.take_away()
        return data

    def take_away(self) -> list[dict]:
        """The recommended setting (and the best speculative one where the target alone is recommended) as
        configuration for transformers, llama.cpp and vLLM (``disco.policies.export``), with vLLM's batch-size table
        modelled from this profile."""
        out = []
        for key in ("auto", "best_speculative"):
            spec = self.recommended.get(key)
            if not spec or any(t["setting"] == spec for t in out):
                continue
            base, precision = split_precision(spec)
            table = self.batch_table(precision) if precision in self.assistant_ms else None
            out.append({"setting": spec, "role": key, **export.take_away(parse_strategy(base), table or None)})
        return out

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
            measured_at=data.get("measured_at", ""), preliminary=bool(data.get("preliminary", False)),
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
# the cache


def _dir(root=None) -> Path:
    return Path(root).expanduser() if root is not None else cache.machine_dir()


def path_for(key: dict, dtype: str, prompts, max_new_tokens: int, root=None) -> Path:
    blob = {"key": key, "dtype": dtype, "prompts": list(prompts), "tokens": max_new_tokens, "format": FORMAT}
    return _dir(root) / f"profile-{key_hash(blob)}.json"


def load_cached(models: str, pair, prompts=DEFAULT_PROMPTS, max_new_tokens: int = DEFAULT_TOKENS,
                root=None) -> Profile | None:
    key = machine_key(models, pair.device, getattr(pair, "engine", "torch"))
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
    key = machine_key(models, pair.device, getattr(pair, "engine", "torch"))
    best = None
    for path in _dir(root).glob("profile-*.json"):
        try:
            prof = Profile.from_dict(json.loads(path.read_text()))
        except (OSError, ValueError, KeyError, TypeError, ProfileError):
            continue
        if prof.key == key and prof.dtype == pair.dtype_name and (best is None or prof.measured_at > best.measured_at):
            best = prof
    return best


def latest_for(models: str, engine: str, device: str = "cpu", root=None) -> Profile | None:
    """The newest profile of ``models`` on ``engine`` on this machine, whatever its dtype and prompts (the other
    engine's curve on the This-machine tab, without loading its models)."""
    key = machine_key(models, device, engine)
    best = None
    for path in _dir(root).glob("profile-*.json"):
        try:
            prof = Profile.from_dict(json.loads(path.read_text()))
        except (OSError, ValueError, KeyError, TypeError, ProfileError):
            continue
        if prof.key == key and (best is None or prof.measured_at > best.measured_at):
            best = prof
    return best


def save(profile: Profile, root=None) -> Path | None:
    """Keep the profile; once both engines have one for this pair, the measured engine choice is decided anew
    (``disco.costs.engines``: what ``--engine auto`` then runs)."""
    path = path_for(profile.key, profile.dtype, profile.prompts, profile.max_new_tokens, root)
    written = cache.write_json(path, profile.to_dict())
    if root is None and not profile.preliminary:
        models, device = profile.key.get("models", ""), profile.key.get("device", "cpu")
        found = [p for p in (latest_for(models, e, device) for e in ("llamacpp", "torch")) if p is not None]
        engines.update(models, found, device)
    return written


def auto_policy(profile: Profile | None, assistant: str | None = None):
    """The ``auto`` lane as a fresh policy: the profile's recommended setting, drafting with its recommended
    assistant precision unless ``assistant`` names another. Raises ProfileError while no profile is known."""
    if profile is None or "auto" not in profile.recommended:
        raise ProfileError("the 'auto' lane needs this machine's profile, which is not measured yet "
                           "(python -m disco profile measures it; the app does so in the background)")
    base, precision = split_precision(profile.recommended["auto"])
    return parse_strategy(base).drafting_with(assistant or precision)
