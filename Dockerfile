# The AstraFlow image: every component (`astraflow feed|rollout|stream|train|evaluate ...`) runs
# from it; docker-compose.yml picks the subcommand. Dependencies come from uv.lock, exactly.
#
#   docker build -t astraflow .
#   docker build --build-arg EXTRAS=vllm -t astraflow:vllm .   # an optional extra from pyproject

# The uv that wrote uv.lock; override with --build-arg UV_VERSION=... when it moves on.
ARG UV_VERSION=0.13.9
# Where uv and Python come from: the public images, or any image with /uv and /uvx, and any with
# Python 3.11 on PATH (scripts/stack.sh builds both from PyPI's uv and Debian 12's packages).
ARG UV_IMAGE=ghcr.io/astral-sh/uv:${UV_VERSION}
ARG PYTHON_IMAGE=python:3.11-slim
FROM ${UV_IMAGE} AS uv

FROM ${PYTHON_IMAGE}

COPY --from=uv /uv /uvx /bin/

ARG EXTRAS=""
# Only for the downloads of this build, and only where a proxy re-signs TLS: a CA bundle the build
# mounts (scripts/stack.sh passes the host's SSL_CERT_FILE). A build argument, so not in the image.
ARG SSL_CERT_FILE
ENV UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_PROJECT_ENVIRONMENT=/opt/venv \
    UV_PYTHON_DOWNLOADS=never \
    PATH="/opt/venv/bin:${PATH}" \
    PYTHONUNBUFFERED=1

WORKDIR /app

# Dependencies first, in their own layer: source edits (README.md included) do not reinstall torch.
COPY pyproject.toml uv.lock ./
RUN --mount=type=cache,target=/root/.cache/uv \
    uv sync --frozen --no-dev --no-install-project ${EXTRAS:+--extra "$EXTRAS"}

COPY README.md ./
COPY astraflow ./astraflow
COPY examples ./examples
RUN --mount=type=cache,target=/root/.cache/uv \
    uv sync --frozen --no-dev ${EXTRAS:+--extra "$EXTRAS"}

VOLUME ["/runs"]
ENTRYPOINT ["astraflow"]
CMD ["--help"]
