"""bmt.layout — where this rank lives in the two-level layout, from the environment.

The same arithmetic as libbmt's runtime/layout.c (DESIGN.md section 2), with
the same names:

    world = groups * gpus_per_group
    group = rank // gpus_per_group     group_rank = rank % gpus_per_group
    node  = rank // gpus_per_node      local_rank = rank % gpus_per_node
    group communicator g:   ranks g * gpus_per_group + i,  i in [0, gpus_per_group)
    replica communicator i: ranks i + g * gpus_per_group,  g in [0, groups)

This rank belongs to group `group` (parameters sharded over its members) and
to replica communicator `replica` == group_rank (gradients averaged over its
members), in which it is member `replica_rank` == group.

bmlaunch exports BMT_RANK, BMT_GROUPS, BMT_GPUS_PER_GROUP, ... (docs/env.md);
under torchrun (or anything else that sets RANK and WORLD_SIZE) the layout is
one group of the whole world. Pure: no torch, no I/O but reading the mapping.
"""

import os
from dataclasses import dataclass

__all__ = ["Layout", "layout", "layout_from_env", "LayoutError"]


class LayoutError(ValueError):
    """The environment does not describe a possible layout (says what and why)."""


@dataclass(frozen=True)
class Layout:
    rank: int
    world: int
    groups: int
    gpus_per_group: int
    gpus_per_node: int
    nodes: int
    group: int
    group_rank: int
    node: int
    local_rank: int
    restart: int = 0
    job_id: str = ""

    @property
    def replica(self):
        """Index of this rank's replica communicator (== group_rank)."""
        return self.group_rank

    @property
    def replica_rank(self):
        """This rank's index in its replica communicator (== group)."""
        return self.group

    def group_members(self, g=None):
        """World ranks of group g (default: this rank's), in group-rank order."""
        g = self.group if g is None else g
        if not 0 <= g < self.groups:
            raise LayoutError("group %d is not in [0, %d)" % (g, self.groups))
        return [g * self.gpus_per_group + i for i in range(self.gpus_per_group)]

    def replica_members(self, i=None):
        """World ranks of replica communicator i (default: this rank's), in group order."""
        i = self.group_rank if i is None else i
        if not 0 <= i < self.gpus_per_group:
            raise LayoutError("replica %d is not in [0, %d)" % (i, self.gpus_per_group))
        return [i + g * self.gpus_per_group for g in range(self.groups)]


def _int(env, name, low=0):
    v = env.get(name)
    if v is None or v == "":
        return None
    # int() would also take "1_0", " 1" and other scripts' digits: not what
    # libbmt reads (plain ASCII decimal, an optional sign)
    body = v[1:] if v[:1] in "+-" else v
    if not (body and all("0" <= c <= "9" for c in body)):
        raise LayoutError("%s='%s' is not an integer" % (name, v))
    n = int(v, 10)
    if n < low:
        raise LayoutError("%s=%d must be at least %d" % (name, n, low))
    return n


def _pick(env, ours, theirs, low=0):
    """BMT_x, or torchrun's name for it; both set and different is an error."""
    a = _int(env, ours, low)
    b = _int(env, theirs, low) if theirs else None
    if a is not None and b is not None and a != b:
        raise LayoutError("%s=%d but %s=%d: the job was started by two launchers, or one of "
                          "them is left over in the environment" % (ours, a, theirs, b))
    return a if a is not None else b


def layout_from_env(env):
    """The Layout that the mapping env (e.g. os.environ) describes.

    Raises LayoutError when a variable is malformed or they disagree."""
    rank = _pick(env, "BMT_RANK", "RANK")
    world = _pick(env, "BMT_WORLD_SIZE", "WORLD_SIZE", 1)
    groups = _int(env, "BMT_GROUPS", 1)
    gpg = _int(env, "BMT_GPUS_PER_GROUP", 1)
    gpn = _pick(env, "BMT_GPUS_PER_NODE", "LOCAL_WORLD_SIZE", 1)
    if rank is None and world is None and groups is None and gpg is None:
        rank, world = 0, 1  # not launched: a job of one rank
    if world is None:
        if groups is None or gpg is None:
            raise LayoutError("%s is set but neither WORLD_SIZE nor both BMT_GROUPS and "
                              "BMT_GPUS_PER_GROUP are: the job's size is unknown"
                              % ("RANK or BMT_RANK" if rank is not None else
                                 "BMT_GROUPS" if groups is not None else "BMT_GPUS_PER_GROUP"))
        world = groups * gpg
    if rank is None:
        raise LayoutError("the job has %d ranks but neither BMT_RANK nor RANK says which this "
                          "one is" % world)
    if groups is None and gpg is None:
        groups, gpg = 1, world
    elif (groups is None) != (gpg is None) and world % (groups or gpg) != 0:
        # one of the two given: the other from the job's size, which it must divide
        raise LayoutError("%s=%d does not divide the job's %d ranks; start it with bmlaunch or "
                          "set BMT_GROUPS/BMT_GPUS_PER_GROUP to fit"
                          % ("BMT_GROUPS" if groups is not None else "BMT_GPUS_PER_GROUP",
                             groups if groups is not None else gpg, world))
    elif groups is None:
        groups = world // gpg
    elif gpg is None:
        gpg = world // groups
    if groups * gpg != world:
        raise LayoutError("the layout %d x %d = %d ranks does not match the job's %d ranks"
                          % (groups, gpg, groups * gpg, world))
    if not 0 <= rank < world:
        raise LayoutError("rank %d is not in [0, %d)" % (rank, world))
    if gpn is None:
        gpn = world
    if world % gpn != 0:
        raise LayoutError("%d ranks (%d x %d) do not fill whole nodes of %d"
                          % (world, groups, gpg, gpn))
    lay = Layout(rank=rank, world=world, groups=groups, gpus_per_group=gpg, gpus_per_node=gpn,
                 nodes=world // gpn, group=rank // gpg, group_rank=rank % gpg, node=rank // gpn,
                 local_rank=rank % gpn,
                 restart=_pick(env, "BMT_RESTART", "TORCHELASTIC_RESTART_COUNT") or 0,
                 job_id=env.get("BMT_JOB_ID", ""))
    # torchrun's GROUP_RANK is the node's index (its "worker group"), not bmt's
    # group_rank: it is not read.
    for name, theirs, want in (("BMT_GROUP", None, lay.group),
                               ("BMT_GROUP_RANK", None, lay.group_rank),
                               ("BMT_NODE", "NODE_RANK", lay.node),
                               ("BMT_LOCAL_RANK", "LOCAL_RANK", lay.local_rank),
                               ("BMT_NODES", None, lay.nodes)):
        for n in (name, theirs):
            got = _int(env, n) if n else None
            if got is not None and got != want:
                raise LayoutError("%s=%d, but the layout %d x %d with %d ranks per node puts "
                                  "rank %d at %d" % (n, got, groups, gpg, gpn, rank, want))
    return lay


def layout():
    """This process's Layout, from os.environ (see layout_from_env)."""
    return layout_from_env(os.environ)
