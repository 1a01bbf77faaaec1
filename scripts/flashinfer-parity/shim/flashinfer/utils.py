"""Stand-in for flashinfer.utils (what the tests' helpers import)."""

import torch


def get_compute_capability(device: torch.device):
    return torch.cuda.get_device_capability(device)


def device_support_pdl(device: torch.device) -> bool:
    return device.type == "cuda" and get_compute_capability(device)[0] >= 9
