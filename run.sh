#!/usr/bin/env bash
# Start DISCO Lab on the embedded model pair: http://127.0.0.1:7860
# (DISCO_MODELS=tiny ./run.sh for the instant random pair; TARGET::ASSISTANT for hub ids or folders)
set -euo pipefail
cd "$(dirname "$0")"
scripts/setup.sh requirements.txt
exec .venv/bin/python app.py "$@"
