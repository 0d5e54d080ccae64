# stopdesk: one image for web, worker and beat; `python -m stopdesk` checks the configuration and
# that the database and the broker answer, then execs gunicorn or celery.
FROM python:3.12-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    DJANGO_SETTINGS_MODULE=stopdesk.settings \
    STOPDESK_ENV=production \
    STOPDESK_BIND_HOST=0.0.0.0 \
    STOPDESK_STATIC_ROOT=/app/staticfiles

WORKDIR /app
# The server's runtime lock alone (requirements/client.in and server.in, `make lock`): no test or lint
# tools and no agent frameworks, which are in requirements-dev.lock.
COPY requirements.lock ./
RUN pip install --no-cache-dir -r requirements.lock

COPY manage.py pyproject.toml ./
COPY stopdesk ./stopdesk
COPY reconcile ./reconcile
COPY stopdrill ./stopdrill

# Static files are collected at build time and served by whitenoise from the web process. The build
# needs settings to load, not a secret: a throwaway key and host are used for this step only.
RUN SECRET_KEY=build-only-not-a-secret-0123456789-abcdefghijklmnopqrstuvwxyz ALLOWED_HOSTS=build \
    python manage.py collectstatic --noinput --verbosity 0

RUN useradd --system --uid 10001 --home-dir /app stopdesk
USER stopdesk

EXPOSE 8000
ENTRYPOINT ["python", "-m", "stopdesk"]
CMD ["web"]
