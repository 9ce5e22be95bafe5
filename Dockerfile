# rtserver on the embedded Piper voice (CPU). Build: docker build -t rtserver .
# Run: docker run -p 8765:8765 rtserver
FROM python:3.11-slim-bookworm
RUN apt-get update && apt-get install -y --no-install-recommends libopus0 \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml README.md ./
COPY rtserver ./rtserver
COPY web_demo ./web_demo
COPY bench ./bench
# the piper extra: the image is a combined work under GPL-3.0-or-later (README "Licence")
RUN pip install --no-cache-dir ".[piper]"
ENV RTSERVER_SERVER_HOST=0.0.0.0 \
    RTSERVER_SERVER_WEB_ROOT=/app/web_demo
EXPOSE 8765
HEALTHCHECK --interval=10s --timeout=3s CMD python -c "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8765/ready').status==200 else 1)"
# SIGTERM drains: contexts finish, then connections close with 1001.
CMD ["rtserver", "serve"]
