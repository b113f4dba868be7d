FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY scheduler ./scheduler
COPY cql ./cql
# tracing: spans go over OTLP once an OTEL_EXPORTER_OTLP_* endpoint is set (docs/tracing.md).
RUN pip install --no-cache-dir ".[console,api,tracing]"
# The secured override's `schema` service creates the roles with it.
COPY ops/secure_setup.py ./ops/
# No USER: the secured override mounts each role's folder as the host made it (files
# 0600, owned by whoever ran ops/secure-stack compose-files), which root reads.
ENTRYPOINT []
