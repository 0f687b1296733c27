"""The processor this process runs on, in the words the book's records, the kernels' cache
and the kernel choice use (:mod:`attention_dynamics.native`)."""
from __future__ import annotations

import platform

__all__ = ["cpu_info", "cpu_model", "processor_key"]


def cpu_info() -> dict[str, str]:
    """The first processor's entries of /proc/cpuinfo (empty where there is none)."""
    info = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break  # the first processor says it all
                k, _, v = line.partition(":")
                info[k.strip()] = v.strip()
    except OSError:
        pass
    return info


def _vector_width(flags: list[str]) -> str:
    return "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"


def cpu_model() -> str:
    """The processor: its model name, family and model numbers and its widest vector
    instructions (from /proc/cpuinfo on Linux), e.g. 'AMD EPYC (family 26 model 2, AVX-512)'."""
    info = cpu_info()
    if "model name" not in info:
        return platform.processor() or platform.machine() or "unknown"
    vector = _vector_width(info.get("flags", "").split())
    return f"{info['model name']} (family {info.get('cpu family', '?')} model {info.get('model', '?')}, {vector})"


def processor_key() -> str:
    """What identifies a processor for a speed measurement: vendor, family, model and the
    widest vector instructions the machine exposes (a virtual machine may hide AVX-512),
    e.g. 'AuthenticAMD family 25 model 17 AVX-512'; the machine type where /proc/cpuinfo
    says nothing (other systems)."""
    info = cpu_info()
    if "cpu family" not in info:
        return f"{platform.system()} {platform.machine() or 'unknown'}"
    vector = _vector_width(info.get("flags", "").split())
    return f"{info.get('vendor_id', '?')} family {info['cpu family']} model {info.get('model', '?')} {vector}"
