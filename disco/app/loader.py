"""Start-up: load the pair once in a background thread (the page shows a status line meanwhile), then measure or
read this machine's cost profile for the This-machine tab and the ``auto`` lane, taking turns with runs."""

from __future__ import annotations

import html
import logging
import math
import os
import threading
import time

from disco.app import machine_plots, machine_tab, zerogpu
from disco.app.session import COMPUTE_LOCK
from disco.bench import kernel_price, machine_profile
from disco.costs import profile
from disco.errors import InputError, Interrupted, UserError
from disco.models import ModelLoadError, background, engine_choice, llama, load_pair, memory, resolve_assistant
from disco.models.load import resolve_engine

log = logging.getLogger("disco.app")


class ModelLoader:
    """Loads the pair once, in a background thread, so the page can show a status line meanwhile; then measures
    (or reads from the cache) this machine's cost profile in the same thread, chunk by chunk through
    ``COMPUTE_LOCK.background`` (a user's run waits for at most the chunk in flight), for the "This machine" tab
    and the ``auto`` lane."""

    def __init__(self, spec: str, dtype: str = "auto", device: str = "auto", assistant: str | None = None,
                 profile: bool | None = None, engine: str | None = None):
        self.spec, self.dtype, self.device = spec, dtype, device
        self.engine_choice = engine or os.environ.get("DISCO_ENGINE") or "auto"
        self.offered = offered_engines()  # the operator's DISCO_ENGINES (None: the default rule, ``engines``)
        try:  # cheap (an import check): the menu needs it before the models are loaded
            self.engine: str | None = resolve_engine(self.engine_choice, spec, device, dtype)
            if self.offered and self.engine not in self.offered:
                self.engine = resolve_engine(self.offered[0], spec, device, dtype)
        except ModelLoadError:
            self.engine = None  # loading reports why
        self._others: dict[str, object] = {}  # pairs of the other engine, loaded on a run's first use
        self._others_lock = threading.Lock()
        self.assistant = assistant or os.environ.get("DISCO_ASSISTANT_PRECISION", "auto")
        self.profile_enabled = (os.environ.get("DISCO_PROFILE", "on").strip().lower() not in ("0", "off", "no")
                                if profile is None else profile)
        self.pair = None
        self.error: Exception | None = None
        self.profile = None
        self.profile_error: str | None = None
        self.profile_step = "waiting for the models"
        self.load_step = "starting"  # what loading waits for now (the status line says it)
        self.started = time.perf_counter()
        self._done = threading.Event()
        self._profile_done = threading.Event()
        self._others_done = threading.Event()
        self.other_engine_note: str | None = None
        self.kernels: dict | None = None  # what exact kernels cost here (disco.bench.kernel_price), llama.cpp only
        self.kernels_note: str | None = None
        self._figures: tuple | None = None  # (the tab's text, its two figures): drawn once per text
        self._thread: threading.Thread | None = None

    def start(self) -> "ModelLoader":
        if self._thread is None:
            # stopped and waited for at the process's exit (disco.models.background), never cut off mid-pass
            self._thread = background.start(self._load, "disco-model-loader")
        return self

    def _load(self) -> None:
        print(f"DISCO Lab: loading the {self.spec!r} model pair…", flush=True)
        try:
            self.engine = self.engine or resolve_engine(self.engine_choice, self.spec, self.device, self.dtype)
            pair = load_pair(self.spec, dtype=self.dtype, device=self.device, progress=True, engine=self.engine,
                             log=self._say)
            self.pair = resolve_assistant(pair, self.assistant, log=self._say)
            self.load_step = "warming up"
            zerogpu.gpu(self.pair.warmup, zerogpu.WARMUP_S)()
            print(f"DISCO Lab: models ready in {time.perf_counter() - self.started:.1f} s: {self.pair.describe()}",
                  flush=True)
        except Exception as exc:  # shown in the page; every run then reports it (Interrupted: the process is exiting)
            self.error = exc
            print(f"DISCO Lab: could not load the models: {exc}", flush=True)
        finally:
            self._done.set()
        self._measure_profile()
        self._price_kernels()
        self._measure_other_engines()

    def _say(self, message: str) -> None:
        """A loading step: printed, and shown in the page's status line until the next one."""
        print(message, flush=True)
        self.load_step = str(message).removeprefix("[disco] ").strip()

    def _measure_profile(self) -> None:
        try:
            if self.pair is None:
                self.profile_error = "the models could not be loaded"
            elif not self.profile_enabled:
                self.profile_error = "profiling is off (DISCO_PROFILE=off)"
            else:
                self.profile = profile.latest(self.spec, self.pair)
                if self.profile is None:
                    def step(message: str) -> None:
                        self.profile_step = message
                    # a quick first look (about a minute on llama.cpp), shown while the full profile is measured
                    turns = COMPUTE_LOCK.background  # users' runs go first
                    measure = zerogpu.gpu(machine_profile.measure, zerogpu.profile_seconds())
                    self.profile = measure(self.pair, self.spec, log=step, lock=turns, quick=True)
                    self.profile = measure(self.pair, self.spec, log=step, lock=turns)
                    profile.save(self.profile)
                rec = self.profile.recommended
                print(f"DISCO Lab: machine profile ready: auto = {rec.get('auto')} "
                      f"({rec.get('auto_speedup', math.nan):.2f}x by replay)", flush=True)
        except Interrupted:  # the process is exiting
            self.profile_error = "stopped"
        except Exception as exc:  # the race works without it; the tab says why
            log.exception("profile failed")
            self.profile_error = f"{type(exc).__name__}: {exc}"
        finally:
            self._profile_done.set()

    def _price_kernels(self) -> None:
        """llama.cpp's exact kernels priced against its defaults (``disco.bench.kernel_price``): read from the cache, or
        measured once in the background with llama-bench (about a minute, taking turns like the profile) where the
        machine has room for the second copy of the target's weights that llama.cpp's repacking makes."""
        path = getattr(self.pair, "target_path", None)
        if path is None or getattr(self.pair, "engine", None) != "llamacpp" or not self.profile_enabled:
            return
        try:
            self.kernels = kernel_price.load_cached(path)
            if self.kernels is not None:
                return
            short = memory.shortfall([path])
            if short is not None:
                need, free = short
                self.kernels_note = (f"pricing them needs about {memory.gib(need)} more memory and this machine has "
                                     f"{memory.gib(free)} free (`python -m disco profile --kernels` does it elsewhere)")
                return

            def step(message: str) -> None:
                self.profile_step = message
            self.kernels = kernel_price.get(path, chunk=lambda: COMPUTE_LOCK.background, say=step, pair=self.pair)
        except Interrupted:  # the process is exiting
            pass
        except UserError as exc:  # e.g. llama-bench not built here: expected, said in the tab
            log.warning("llama.cpp's kernels not priced: %s", exc)
            self.kernels_note = str(exc)
        except Exception as exc:  # the tab says why; the rest of the app works without it
            log.exception("pricing llama.cpp's kernels failed")
            self.kernels_note = f"{type(exc).__name__}: {exc}"

    def _measure_other_engines(self) -> None:
        """The other engines this deployment offers, profiled in the background once (taking turns like the app's own
        profile), so the engine choice is a measurement (``disco.costs.engines``); an engine that needs a conversion
        first or does not fit the free memory is left out, and the tab says how to measure it."""
        try:
            if self.pair is None or not self.profile_enabled or self.profile is None:
                return
            for engine in self.engines()[1:]:
                device = str(self.pair.device)
                if profile.latest_for(self.spec, engine, device) is not None:
                    continue
                self.profile_step = f"loading the {engine} engine's pair to compare the engines"
                with self._others_lock:  # one load of a pair, whether a visitor's run or this asks for it first
                    if engine not in self._others:
                        try:
                            check_room(self.spec, engine)
                        except ModelLoadError as exc:
                            self.other_engine_note = str(exc)
                            continue
                        with COMPUTE_LOCK.background:
                            self._others[engine] = resolve_assistant(
                                load_pair(self.spec, dtype=self.dtype, device=self.device, progress=False,
                                          engine=engine, log=lambda m: None), self.assistant, log=lambda m: None)
                other = self._others[engine]

                def step(message: str, engine=engine) -> None:
                    self.profile_step = f"{engine}: {message}"
                measure = zerogpu.gpu(machine_profile.measure, zerogpu.profile_seconds())
                profile.save(measure(other, self.spec, log=step, lock=COMPUTE_LOCK.background))
        except Interrupted:  # the process is exiting
            pass
        except Exception as exc:  # the app's own engine works without it; the tab says why
            log.exception("the other engine's profile failed")
            self.other_engine_note = f"{type(exc).__name__}: {exc}"
        finally:
            self._others_done.set()

    def get_profile(self, engine: str | None = None):
        """This machine's profile for ``engine`` (default: the app's), or None while it is measured (or when it
        could not be, or, for the other engine, was never measured here)."""
        if engine in (None, "", "default", self.engine):
            return self.profile
        return profile.latest_for(self.spec, engine)

    @property
    def ready(self) -> bool:
        return self._done.is_set()

    def get(self, timeout: float | None = None, engine: str | None = None):
        """The pair, waiting for start-up loading; raises ModelLoadError if it failed. ``engine`` (``torch`` or
        ``llamacpp``) other than the start-up one loads that engine's pair on first use (one engine per run, so
        the lanes of a race stay comparable)."""
        self.start()
        if not self._done.wait(timeout):
            raise ModelLoadError("the models are still loading; try again in a moment")
        if self.error is not None:
            raise ModelLoadError(f"the models could not be loaded: {self.error}")
        if engine in (None, "", "default", self.engine):
            return self.pair
        if engine not in self.engines():
            raise ModelLoadError(f"the {engine} engine cannot run {self.spec!r} here (engines: "
                                 f"{', '.join(self.engines())})")
        with self._others_lock:
            if engine not in self._others:
                check_room(self.spec, engine)  # never a conversion in a request, never past the memory there is
                with COMPUTE_LOCK:  # reading GBs of weights: never beside a timed race or the background profile
                    pair = load_pair(self.spec, dtype=self.dtype, device=self.device, progress=True, engine=engine)
                    self._others[engine] = resolve_assistant(pair, self.assistant, log=print)
                    zerogpu.gpu(self._others[engine].warmup, zerogpu.WARMUP_S)()
            return self._others[engine]

    def engines(self) -> list[str]:
        """The engines this deployment offers for the pair (the start-up one first): those that can run it here,
        limited by ``DISCO_ENGINES``; on a Hugging Face Space without it, the start-up engine only (a second pair
        would double the memory a CPU Space has)."""
        found = [self.engine] if self.engine else []
        if self.offered is None and os.environ.get("SPACE_ID"):
            return found
        for name in ("llamacpp", "torch"):
            if name in found or (self.offered is not None and name not in self.offered):
                continue
            try:
                resolve_engine(name, self.spec, self.device, self.dtype)
            except ModelLoadError:
                continue
            found.append(name)
        return found


    def status(self) -> str:
        if not self.ready:
            return (f"○ Loading the **{self.spec}** model pair… "
                    f"({time.perf_counter() - self.started:.0f} s; runs start as soon as it is ready) · now: "
                    f"{html.escape(self.load_step[:160])}")
        if self.error is not None:
            return f"✗ The **{self.spec}** models could not be loaded: {html.escape(str(self.error))}"
        d = self.pair.describe()
        variant = f", {d['cpu_variant']} CPU variant" if d.get("cpu_variant") else ""
        engine = ("llama.cpp" + (" (exact kernels" if d.get("exact") else " (its default kernels") + variant + ")"
                  if d.get("engine") == "llamacpp" else "torch")
        return (f"● Models ready: target **{d['target']}**, assistant **{d['assistant']}** "
                f"({d['assistant_precision']} by default) · engine **{engine}** · {d['dtype']} on {d['device']} · context "
                f"{self.pair.context_length} tokens · loaded in {self.pair.load_seconds:.1f} s · numerics and "
                "costs: see **This machine**")

    def machine_markdown(self) -> str:
        data = self.profile.to_dict() if self.profile is not None else None
        cal = getattr(self.pair, "calibration", None)
        device = str(getattr(self.pair, "device", "cpu"))
        measured = [e for e in self.engines() if profile.latest_for(self.spec, e, device) is not None]
        engines = machine_tab.engines_md(engine_choice.load(self.spec, device), measured, self.engines())
        if self.other_engine_note and engines:
            engines += f"  \n<small>The other engine was not measured here: {html.escape(self.other_engine_note)}</small>"
        busy = not (self._profile_done.is_set() and self._others_done.is_set())
        return machine_tab.markdown(data, cal.to_dict() if cal is not None else None,
                                    self.profile_step if busy else None, self.profile_error,
                                    self.pair.describe() if self.pair is not None else None, engines,
                                    machine_tab.kernels_md(self.kernels, self.kernels_note))

    def machine_outputs(self, md: str | None = None) -> tuple:
        """The tab's text and figures; the figures are drawn once per text (a caller cannot make the app redraw them
        by asking again)."""
        md = md if md is not None else self.machine_markdown()
        cached = self._figures
        if cached is None or cached[0] != md:
            data = self.profile.to_dict() if self.profile is not None else None
            # every engine measured here draws its verification curve (the other one from its cached profile)
            others = [p.to_dict() for e in self.engines() if e != self.engine
                      for p in [profile.latest_for(self.spec, e)] if p is not None]
            self._figures = cached = (md, machine_plots.machine_cost_figure(data, others),
                                   machine_plots.machine_speedup_figure(data))
        return cached

    def poll(self, shown_status: str | None = None, shown_machine: str | None = None) -> tuple:
        """For the page's timer (and its first load): the status line and the This-machine tab, each sent only when
        it differs from what the page shows (figures are drawn only then), and the timer itself, stopped once the
        models and the profile are ready (an idle page then costs nothing)."""
        import gradio as gr

        status = self.status()
        md = self.machine_markdown()
        if md != shown_machine:
            machine = self.machine_outputs(md)
        else:
            machine = (gr.skip(), gr.skip(), gr.skip())
        done = self.ready and self._profile_done.is_set() and self._others_done.is_set()
        return (status if status != shown_status else gr.skip(), *machine, gr.Timer(active=not done))


ENGINES_ENV = "DISCO_ENGINES"


def offered_engines() -> tuple[str, ...] | None:
    """The operator's ``DISCO_ENGINES`` (comma-separated llamacpp, torch; None when unset or ``auto``); anything else
    is refused in one line."""
    raw = os.environ.get(ENGINES_ENV, "").strip().lower()
    if raw in ("", "auto"):
        return None
    names = tuple(dict.fromkeys(x.strip() for x in raw.split(",") if x.strip()))
    if not names or any(n not in ("llamacpp", "torch") for n in names):
        raise InputError(f"{ENGINES_ENV}={raw!r}: give llamacpp, torch or both, comma-separated (or auto)")
    return names


def check_room(spec: str, engine: str) -> None:
    """Refuse, in one line, a second pair whose weights need a conversion first or do not fit the free memory."""
    try:
        weights = memory.pair_weights(spec, engine)
    except memory.NotPrepared as exc:
        raise ModelLoadError(f"the {engine} engine is not ready here: {exc}") from None
    if weights is None:
        return  # a pair built in code, or hub ids: nothing on disk to measure
    twins = engine == "llamacpp" and llama.exact_mode() and llama.fast_prefill_mode()  # a repacked twin per model
    short = memory.shortfall(weights, copies=2 if twins else 1)
    if short is not None:
        need, free = short
        raise ModelLoadError(f"the {engine} engine's pair needs about {memory.gib(need)} of memory and this machine has "
                             f"{memory.gib(free)} free: it is not loaded (the {engine} engine stays off here)")
