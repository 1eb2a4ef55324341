"""`compose`: a docker compose service running the measured point, with its GPUs reserved and a
healthcheck on /health whose start period is the measured start-up.

Secrets are passed by name (`environment: [VLLM_API_KEY]`): compose takes their values from the
shell that runs it, so no value is written into the file.
"""

from __future__ import annotations

import math

from planner.export import yamltext
from planner.export.provenance import SERVE_PORT, MeasuredPoint, Options, commented, header_lines

HEALTH_INTERVAL_S = 10


def document(point: MeasuredPoint, options: Options) -> dict:
    image = point.image()
    env: list[str] = [f"{k}={v}" for k, v in sorted(point.env.items())] + list(point.secret_env)
    service: dict = {
        "image": image.value,
        "command": point.server_args(),
        "ports": [f"{SERVE_PORT}:{SERVE_PORT}"],
        # Tensor-parallel workers share memory through /dev/shm; vLLM's docs run its image with --ipc=host.
        "ipc": "host",
        "deploy": {
            "resources": {
                "reservations": {
                    "devices": [{"driver": "nvidia", "count": int(point.gpus.value), "capabilities": ["gpu"]}]
                }
            }
        },
        "healthcheck": {
            # The image has Python (vLLM runs on it); curl is not promised.
            "test": ["CMD", "python3", "-c", f"import urllib.request; urllib.request.urlopen('http://127.0.0.1:{SERVE_PORT}/health', timeout=4)"],
            "interval": f"{HEALTH_INTERVAL_S}s",
            "timeout": "5s",
            "retries": 3,
        },
    }
    if env:
        service["environment"] = env
    allowance = point.startup_allowance_s(options)
    if allowance is not None:
        service["healthcheck"]["start_period"] = f"{math.ceil(allowance)}s"
    return {"services": {point.app_name: service}}


def render(point: MeasuredPoint, options: Options) -> str:
    lines = header_lines(point, "docker compose service")
    lines.append(f"image {point.image().value}: {point.image().source}")
    lines.append(f"GPUs reserved {point.gpus}: {point.gpus.source}")
    lines.append(f"healthcheck start_period: {point.startup_text(options)}")
    if point.secret_env:
        lines.append(f"secrets taken from the shell that runs compose: {', '.join(point.secret_env)}")
    return commented(lines) + yamltext.dump(document(point, options))
