"""bmt.torch — the two-level layout as torch.distributed process groups and a DeviceMesh.

    bmt.torch.init_process_group()         # gloo on cpu, nccl on cuda; env:// rendezvous
    pg = bmt.torch.process_groups()        # pg.group: this rank's group; pg.replica: its replica
    mesh = bmt.torch.device_mesh()         # (groups, gpus_per_group), dims "replicate", "shard"
    fully_shard(model, mesh=mesh)          # HSDP: shard in a group, replicate across groups

The groups are those of libbmt (DESIGN.md section 2): group g holds ranks
g*gpus_per_group + i, replica communicator i the ranks i + g*gpus_per_group.
The mesh is the same picture: row g is group g, column i is replica i, so
FSDP's HSDP shards parameters over a group (the mesh's "shard" dim) and
all-reduces gradients across groups (its "replicate" dim).

Works with torch 1.13 (process groups through new_group) and 2.x; the mesh
needs torch >= 2.2 (torch.distributed.device_mesh.init_device_mesh).
"""

import os
import re
from collections import namedtuple

import torch
import torch.distributed as dist

from .layout import layout as _layout
from .metrics import _device

__all__ = ["init_process_group", "process_groups", "device_mesh", "MESH_DIMS", "ProcessGroups"]

MESH_DIMS = ("replicate", "shard")
ProcessGroups = namedtuple("ProcessGroups", "group replica layout")
_cache = {}


def _version():
    m = re.match(r"(\d+)\.(\d+)", torch.__version__)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def device_type():
    """"cuda" when BMT_DEVICE says so (bmlaunch --device cuda), else "cpu".
    A BMT_DEVICE that is neither raises ValueError (not a silent run on cpu)."""
    return "cuda" if _device(os.environ) == "cuda" else "cpu"


def init_process_group(backend=None, **kw):
    """torch.distributed.init_process_group for this rank of the layout: rank
    and world from bmt.layout(), rendezvous through MASTER_ADDR and MASTER_PORT
    (bmlaunch exports them, as torchrun does). backend: default gloo on cpu,
    nccl on cuda (where it also selects GPU local_rank). Returns the Layout."""
    lay = _layout()
    dev = device_type()
    if dev == "cuda":
        torch.cuda.set_device(lay.local_rank)
    if not dist.is_initialized():
        missing = [v for v in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(v)]
        if missing and "init_method" not in kw and "store" not in kw:
            raise RuntimeError("bmt.torch.init_process_group: %s not set: run under a bmlaunch "
                               "that exports torchrun's variables, or set MASTER_ADDR and "
                               "MASTER_PORT" % " and ".join(missing))
        dist.init_process_group(backend or ("nccl" if dev == "cuda" else "gloo"),
                                rank=lay.rank, world_size=lay.world, **kw)
    if dist.get_world_size() != lay.world or dist.get_rank() != lay.rank:
        raise RuntimeError("torch.distributed has rank %d of %d, the bmt layout rank %d of %d"
                           % (dist.get_rank(), dist.get_world_size(), lay.rank, lay.world))
    return lay


def _check_ranks(who):
    """The Layout, once torch.distributed's rank and world are the layout's: a
    process whose torch rank is not its bmt rank would get groups it is not a
    member of, and torch only warns when a collective runs on such a group."""
    lay = _layout()
    if dist.get_world_size() != lay.world or dist.get_rank() != lay.rank:
        raise RuntimeError("bmt.torch.%s: torch.distributed has rank %d of %d, the bmt layout "
                           "%d x %d rank %d of %d: initialize it with bmt.torch."
                           "init_process_group(), or with rank=RANK and world_size=WORLD_SIZE"
                           % (who, dist.get_rank(), dist.get_world_size(), lay.groups,
                              lay.gpus_per_group, lay.rank, lay.world))
    return lay


def process_groups(backend=None):
    """This rank's group and replica process groups (a ProcessGroups tuple:
    group, replica, layout). Collective: every rank must call it, the first
    time in the same order relative to other new_group calls. The result is
    cached; later calls return the same groups."""
    if "pg" in _cache:
        return _cache["pg"]
    if not dist.is_initialized():
        raise RuntimeError("bmt.torch.process_groups: torch.distributed is not initialized "
                           "(call bmt.torch.init_process_group() first)")
    lay = _check_ranks("process_groups")
    # new_group is collective over the world: every rank makes every group, in order.
    group = replica = None
    for g in range(lay.groups):
        pg = dist.new_group(lay.group_members(g), backend=backend)
        if g == lay.group:
            group = pg
    for i in range(lay.gpus_per_group):
        pg = dist.new_group(lay.replica_members(i), backend=backend)
        if i == lay.replica:
            replica = pg
    _cache["pg"] = ProcessGroups(group, replica, lay)
    return _cache["pg"]


def device_mesh(device=None):
    """A 2-D DeviceMesh of shape (groups, gpus_per_group) with dims named
    MESH_DIMS ("replicate", "shard"): fully_shard(model, mesh=mesh) is HSDP.
    Needs torch >= 2.2; raises RuntimeError saying so on older ones."""
    if _version() < (2, 2):
        raise RuntimeError("bmt.torch.device_mesh needs torch >= 2.2 (DeviceMesh with named "
                           "dims, for fully_shard's HSDP); this is torch %s: use "
                           "bmt.torch.process_groups() for the group and replica process groups"
                           % torch.__version__)
    from torch.distributed.device_mesh import init_device_mesh
    if "mesh" in _cache:
        return _cache["mesh"]
    # not yet initialized: init_device_mesh does it through env://, with RANK
    # and WORLD_SIZE, which bmt.layout() has checked against the layout
    lay = _check_ranks("device_mesh") if dist.is_initialized() else _layout()
    _cache["mesh"] = init_device_mesh(device or device_type(), (lay.groups, lay.gpus_per_group),
                                      mesh_dim_names=MESH_DIMS)
    return _cache["mesh"]
