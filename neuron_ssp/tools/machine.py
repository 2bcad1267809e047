"""What a benchmark ran on: every published speed figure carries it."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from typing import Any

import torch
import transformers

from neuron_ssp.backends.torch.row_kernel import row_kernel, unavailable_reason


def cpu_model() -> str:
    """`lscpu`'s model name (what the docs quote), else /proc/cpuinfo's, else the platform's."""
    if shutil.which("lscpu"):
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info(device: str = "cpu") -> dict[str, Any]:
    info: dict[str, Any] = {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "device": device,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "cpu_kernel": "row kernel" if row_kernel() is not None else f"oneDNN packed ({unavailable_reason()})",
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    return info


def describe_machine(info: dict[str, Any]) -> str:
    gpu = f", {info['gpu']}" if info.get("gpu") else ""
    return (
        f"{info['cpu']} ({info['cores']} cores, {info['torch_threads']} torch threads){gpu}, "
        f"device {info['device']}, torch {info['torch']}, transformers {info['transformers']}, "
        f"CPU fp32 kernel: {info.get('cpu_kernel', 'not recorded')}"
    )
