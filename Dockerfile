# One image for every Mosaic service: `docker run IMAGE services.<name> [flags]`.
#
# Why one image: the services share proto/ and libs/ and are released together; one image means
# one build, one vulnerability scan and no version skew between the placer and the executor.
# The NVML library is not in the image: on a GPU node the NVIDIA container toolkit mounts it.

FROM python:3.11-slim AS build
WORKDIR /src
COPY . .
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    MOSAIC_LOG_FORMAT=json \
    NUMBA_CACHE_DIR=/tmp/numba
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl \
    && rm -rf /wheels \
    && useradd --system --uid 10001 --home-dir /var/lib/mosaic --create-home mosaic
USER 10001:10001
WORKDIR /var/lib/mosaic
# 8080: gateway HTTP (MOSAIC_HTTP_PORT); 9100: Prometheus /metrics (MOSAIC_METRICS_PORT).
EXPOSE 8080 9100
ENTRYPOINT ["python", "-m"]
CMD ["services.gateway"]
