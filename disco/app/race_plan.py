"""The race's inputs become a run: each lane's policy from its menus and the shared sliders, the decoding settings,
the engine, and the pair that runs it (``plan``: everything checked before anything runs)."""

from __future__ import annotations

from dataclasses import dataclass

from disco import limits
from disco.app.race_inputs import (
    ASSISTANT_CHOICES, AUTO, DEFAULT_ASSISTANT, DEFAULT_ENGINE, DEFAULTS, ENGINE_CHOICES, LANE_KINDS, RACE_CONTROLS,
    SLIDER_WHAT, RaceRequest,
)
from disco.costs.profile import auto_policy
from disco.decode.race import build_policies
from disco.decode.settings import DecodeSettings
from disco.errors import InputError
from disco.policies import (
    AUTOREGRESSIVE, Autoregressive, Policy, StrategyError, canonical_spec, parse_strategy, policy_class,
)


def lane_policy(kind: str, k=DEFAULTS.k, threshold=DEFAULTS.threshold, max_lookahead=DEFAULTS.max_lookahead,
                assistant: str = DEFAULT_ASSISTANT, profile=None) -> Policy:
    """A lane's policy from its policy menu, its assistant menu and the shared sliders.

    The menu holds kinds (``static``); a full spec typed into it (``threshold:0.3:8``) is used verbatim.
    A kind's parameters are filled from its metadata: each ``Param`` names the shared slider that fills it (K from
    the static slider, TAU from the threshold slider, KMAX from the maximum-lookahead slider), so kinds added to the
    engine later work unchanged. ``auto`` is this machine's recommended setting (``profile``, the cost profile; it
    names its assistant). An explicit ``assistant`` (model / int8) becomes ``@model`` / ``@int8`` unless the spec
    names one.
    """
    kind = limits.as_text(kind, "a lane's policy").strip()
    if not kind:
        raise InputError("a lane has no policy selected")
    assistant = (limits.as_text(assistant, "a lane's assistant") or DEFAULT_ASSISTANT).strip().lower()
    if assistant not in ASSISTANT_CHOICES:
        raise InputError(f"unknown assistant {assistant!r}: choose one of {', '.join(ASSISTANT_CHOICES)}")
    chosen = None if assistant == DEFAULT_ASSISTANT else assistant
    if kind == AUTO:
        if profile is None or "auto" not in (getattr(profile, "recommended", None) or {}):
            raise InputError("the 'auto' lane needs this machine's profile, which is still being measured "
                             "(see the This machine tab); pick another policy meanwhile")
        return auto_policy(profile, chosen)  # the lane's menu overrides the recommended assistant
    policy = parse_strategy(kind) if ":" in kind else _from_sliders(kind, k, threshold, max_lookahead)
    return policy if policy.assistant_precision is not None else policy.drafting_with(chosen)


def _from_sliders(kind: str, k, threshold, max_lookahead) -> Policy:
    """A kind's policy with each parameter taken from the shared slider its metadata names (``Param.slider``)."""
    if kind not in LANE_KINDS and kind != AUTOREGRESSIVE:
        raise StrategyError(f"unknown policy {kind!r}: choose one of {', '.join(LANE_KINDS)} or type a full spec")
    cls = policy_class(kind)
    if cls.composite:  # the sliders fill its assistant part (``Hybrid.from_parts``)
        return cls.from_parts(lambda part: _from_sliders(part, k, threshold, max_lookahead))
    sliders = {"k": k, "threshold": threshold, "kmax": max_lookahead}
    values = {}
    for p in cls.params:
        raw = sliders.get(p.slider)
        if raw is None:
            continue  # no slider for it: the kind's default
        what = SLIDER_WHAT[p.slider]
        values[p.name] = limits.as_int(raw, what) if p.type is int else limits.as_float(raw, what)
    return parse_strategy(canonical_spec(kind, **values))  # through the grammar: the parameters' own range checks


def lane_policies(lane_a: str, lane_b: str, k, threshold, max_lookahead, baseline: bool,
                  assistants=(DEFAULT_ASSISTANT, DEFAULT_ASSISTANT), profile=None) -> tuple[list[Policy], list[str]]:
    """The race's lanes as policies (baseline first) and notes for the user (e.g. a duplicate lane dropped)."""
    lanes = [lane_policy(lane, k, threshold, max_lookahead, a, profile) for lane, a in zip((lane_a, lane_b), assistants)]
    notes = [f"auto = {lanes[(lane_a, lane_b).index(AUTO)].spec} (this machine's recommended setting)"] \
        if AUTO in (lane_a, lane_b) else []
    if lanes[0].spec == lanes[1].spec:
        notes.append(f"both lanes are {lanes[0].spec}; running it once")
        lanes = lanes[:1]
    if any(p.spec == AUTOREGRESSIVE for p in lanes):
        lanes = [p for p in lanes if p.spec != AUTOREGRESSIVE]
        baseline = True
    policies = ([Autoregressive()] if baseline else []) + lanes
    if not baseline:
        notes.append("no baseline lane: speed-ups are not available")
    return policies, notes


def decode_settings(max_new_tokens=DEFAULTS.max_new_tokens, sample=DEFAULTS.sample, temperature=DEFAULTS.temperature,
                    top_p=DEFAULTS.top_p, seed=DEFAULTS.seed) -> DecodeSettings:
    seed = limits.check_seed(seed)
    settings = DecodeSettings(
        max_new_tokens=limits.as_int(max_new_tokens, "max new tokens"), sample=bool(sample),
        temperature=limits.as_float(temperature, "temperature"), top_p=limits.as_float(top_p, "top-p"), seed=seed,
    )
    settings.validate()
    return settings


def request_of(request, values: dict) -> RaceRequest:
    """The run's typed request: given, or parsed from the controls' raw values (one line for a bad one)."""
    if isinstance(request, RaceRequest):
        if values:
            raise InputError(f"give the request or its values, not both ({', '.join(values)})")
        return request
    raw = dict(request) if isinstance(request, dict) else {"prompt": request, **values}
    return RACE_CONTROLS.parse(raw)


def engine_name(engine) -> str:
    """The engine a run asked for, as the menu spells it (the default when none)."""
    return (str(engine).strip().lower() if engine is not None else DEFAULT_ENGINE) or DEFAULT_ENGINE


@dataclass(frozen=True)
class Plan:
    """A race's checked inputs: what runs, on which engine, with which settings."""

    engine: str
    lanes: list
    notes: list
    prompt: str
    settings: object
    budgets: limits.Budgets
    profile: object


def plan(req: RaceRequest, get_profile) -> Plan:
    """The controls become policies and settings here, once: a typo fails before anything runs (``UserError``)."""
    engine = engine_name(req.engine)
    if engine not in ENGINE_CHOICES:
        raise InputError(f"unknown engine {engine!r}: choose one of {', '.join(ENGINE_CHOICES)}")
    prof = None
    if AUTO in (req.lane_a.strip(), req.lane_b.strip()):
        prof = get_profile() if get_profile is not None else None
    lanes, notes = lane_policies(req.lane_a, req.lane_b, req.k, req.threshold, req.max_lookahead, req.baseline,
                                 (req.lane_a_assistant, req.lane_b_assistant), prof)
    budgets = limits.Budgets.from_env()
    prompt = limits.check_prompt(req.prompt)
    limits.check_lookahead(build_policies(lanes), budgets.max_lookahead)  # typed specs get the sliders' ranges
    settings = decode_settings(req.max_new_tokens, req.sample, req.temperature, req.top_p, req.seed)
    limits.check_new_tokens(settings.max_new_tokens, budgets)
    return Plan(engine, lanes, notes, prompt, settings, budgets, prof)


def pair_for(get_pair, engine: str):
    """The pair the run uses: ``get_pair`` is a pair or a function returning one (asked with ``engine=`` when the run
    wants an engine other than the app's default)."""
    other = engine not in ("", None, DEFAULT_ENGINE)
    if callable(get_pair):
        return get_pair(engine=engine) if other else get_pair()
    if other and engine != getattr(get_pair, "engine", engine):
        raise InputError(f"this app runs its models on {get_pair.engine}; the {engine} engine is not loaded")
    return get_pair
