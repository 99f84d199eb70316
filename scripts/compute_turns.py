"""How long a user's run waits for the models while the app's background profile is measured: the app's loader on the
embedded pair (llama.cpp), a fresh cache (so the profile is measured, not read), then five "runs" (hold the models
0.5 s, 3 s apart) through ``COMPUTE_LOCK`` (``turns``, the app's) or through the plain ``threading.Lock`` the app used
before (``plain``: the loader's profile is handed the same plain lock).

Usage: PYTHONPATH=. .venv/bin/python scripts/compute_turns.py turns|plain
"""
import os
import sys
import tempfile
import threading
import time

RUNS, HOLD_S, GAP_S = 5, 0.5, 3.0


def main(mode: str) -> None:
    os.environ["DISCO_CACHE"] = tempfile.mkdtemp(prefix="compute-turns-")
    from disco.app import loader
    from disco.models.turns import COMPUTE_LOCK

    if mode == "plain":
        plain = threading.Lock()
        loader.COMPUTE_LOCK = type("PlainTurns", (), {"background": plain})
        user_lock = plain
    else:
        user_lock = COMPUTE_LOCK
    models = loader.ModelLoader("embedded", engine="llamacpp").start()
    models._done.wait()
    if models.pair is None:
        sys.exit(f"the models could not be loaded: {models.error}")
    time.sleep(5)  # the profile is under way
    waits = []
    for i in range(RUNS):
        t0 = time.perf_counter()
        with user_lock:
            waits.append(time.perf_counter() - t0)
            time.sleep(HOLD_S)
        print(f"{mode}: run {i + 1} waited {waits[-1]:.2f} s (profile: {models.profile_step[:70]})", flush=True)
        time.sleep(GAP_S)
    print(f"{mode}: waits (s) {' '.join(f'{w:.2f}' for w in waits)}; profile finished meanwhile: "
          f"{models._profile_done.is_set()}", flush=True)
    os._exit(0)  # the profile is still running: no need to wait for it


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in ("turns", "plain"):
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        sys.exit(2)
    main(sys.argv[1])
