"""bmt — a PyTorch program under bmlaunch: its layout, process groups and
DeviceMesh (bmt.torch), its steps on bmlaunch's metrics page, and a clean
stop on Slurm's SIGUSR1. Pure Python; importing bmt does not import torch.

    import bmt
    lay = bmt.layout()                  # groups, gpus_per_group, group, group_rank, replica, node
    bmt.report_step(tokens=..., loss=..., flops=...)   # tokens/s and MFU on /metrics and the page
    bmt.report_scalar("val_loss", v)                   # bmt_val_loss, and the page's loss chart
    with bmt.Preemption(save=save) as pre:             # SIGUSR1: save at the next step, exit 0
        ...
        pre.step_boundary(step)

docs/python.md describes the API and how the metrics reach the collector.
"""

from .layout import Layout, LayoutError, layout, layout_from_env
from .metrics import (EVENT_KINDS, SCALARS_MAX, Monitor, peak_flops_of, report_event,
                      report_scalar, report_step, step_begin, step_figures)
from .preempt import Preemption

__version__ = "0.1.0"
__all__ = ["Layout", "LayoutError", "layout", "layout_from_env", "report_step", "report_event",
           "report_scalar", "SCALARS_MAX", "step_begin", "step_figures", "peak_flops_of",
           "Monitor", "EVENT_KINDS", "Preemption"]
