# The handoff-observatory image: `handoffs serve`, `handoffs dashboard` and the CLI.
# Used by docker-compose.yml; any command of the CLI works as `docker run IMAGE <command>`.
FROM python:3.12.8-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app

# Dependencies first, so a code change does not reinstall them.
COPY pyproject.toml README.md ./
COPY foundation/ foundation/
COPY collector/ collector/
COPY ingest/ ingest/
COPY serve/ serve/
COPY derive/ derive/
COPY analytics/ analytics/
COPY dashboard/ dashboard/
COPY handoffs/ handoffs/
COPY sql/ sql/
COPY deploy/ deploy/
# Editable install: the code (and sql/, which foundation.store finds next to it) stays in /app.
RUN pip install --no-compile -e . \
    && useradd --system --uid 10001 --home /var/lib/handoffs handoffs \
    && mkdir -p /var/lib/handoffs/spool && chown -R handoffs /var/lib/handoffs

USER handoffs
# serve runs as this unprivileged user: it needs to write only its store and spool directories
EXPOSE 4318 4317 8501
ENTRYPOINT ["handoffs"]
CMD ["--help"]
