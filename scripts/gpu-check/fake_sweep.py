"""A local sweep of the fake vLLM with [gpus] devices = "auto": placement, CUDA_VISIBLE_DEVICES,
memory sampling and the run's hardware identity against a real nvidia-smi.

    PYTHONPATH=. python scripts/gpu-check/fake_sweep.py WORK_DIR '"auto"'
"""
import subprocess
import sys
from pathlib import Path

from tests.fakes.sweep_files import write_ray_sweep_config

work, devices = Path(sys.argv[1]), sys.argv[2]
cfg = write_ray_sweep_config(work, tp=[1], kv_bytes=["4M", "8M"], executor="local")
text = cfg.read_text().replace('devices = "none"', f"devices = {devices}")
text = "\n".join(line for line in text.splitlines() if not line.startswith(("address =", "max_retries =")))
cfg.write_text(text)
sys.exit(subprocess.call([sys.executable, "-m", "planner", "sweep", "--config", str(cfg), "--output", str(work / "out")]))
