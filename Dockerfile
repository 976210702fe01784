# The image jobs/k8s/*-cronjob.yaml name (registry.example/paygate:<version>): paygate installed
# from its wheel into a venv, run as an unprivileged user, `paygate` as the entrypoint so a pod's
# args are just `run-tick WORKER …`. Build: docker build -t registry.example/paygate:0.1.0 .

# Stage 1: build the wheel (SQL migrations are package data inside it).
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

# Stage 2: a venv holding the wheel and its dependencies; no compiler, no source tree.
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/paygate/bin:$PATH \
    TTY_INTERACTIVE=0 \
    PAYGATE_LOG_FORMAT=json
COPY --from=build /wheels /wheels
RUN python -m venv /opt/paygate \
    && /opt/paygate/bin/pip install --no-cache-dir /wheels/*.whl \
    && rm -rf /wheels \
    && groupadd --system --gid 10001 paygate \
    && useradd --system --uid 10001 --gid paygate --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin paygate
# Numeric, so Kubernetes' runAsNonRoot can verify it without resolving a name.
USER 10001:10001
ENTRYPOINT ["/opt/paygate/bin/paygate"]
CMD ["--help"]
