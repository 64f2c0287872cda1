# The AstraFlow image: every component (`astraflow feed|rollout|stream|train|evaluate ...`) runs
# from it; docker-compose.yml picks the subcommand. Dependencies come from uv.lock, exactly.
#
#   docker build -t astraflow .
#   docker build --build-arg EXTRAS=vllm -t astraflow:vllm .   # an optional extra from pyproject

# The uv that wrote uv.lock; override with --build-arg UV_VERSION=... when it moves on.
ARG UV_VERSION=0.13.9
FROM ghcr.io/astral-sh/uv:${UV_VERSION} AS uv

FROM python:3.11-slim

COPY --from=uv /uv /uvx /bin/

ARG EXTRAS=""
ENV UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_PROJECT_ENVIRONMENT=/opt/venv \
    UV_PYTHON_DOWNLOADS=never \
    PATH="/opt/venv/bin:${PATH}" \
    PYTHONUNBUFFERED=1

WORKDIR /app

# Dependencies first, in their own layer: source edits do not reinstall torch.
COPY pyproject.toml uv.lock README.md ./
RUN --mount=type=cache,target=/root/.cache/uv \
    uv sync --frozen --no-dev --no-install-project ${EXTRAS:+--extra "$EXTRAS"}

COPY astraflow ./astraflow
COPY examples ./examples
RUN --mount=type=cache,target=/root/.cache/uv \
    uv sync --frozen --no-dev ${EXTRAS:+--extra "$EXTRAS"}

VOLUME ["/runs"]
ENTRYPOINT ["astraflow"]
CMD ["--help"]
