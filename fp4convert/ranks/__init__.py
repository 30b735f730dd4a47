"""Runs split across ``torch.distributed`` ranks: who does what, and how ranks exchange results.

* :mod:`~fp4convert.ranks.team`: :class:`Team` (a process alone is a team of one) and
  :class:`RankTeam` (the ranks of an initialized process group: JSON exchanged through the
  rendezvous store, heartbeats so a killed rank is named instead of waited for, argument checks,
  one max-reduce on the process group).
* :mod:`~fp4convert.ranks.partition`: ordered work split into contiguous, byte-balanced parts.
* :mod:`~fp4convert.ranks.launch`: the process group a command starts when ``torchrun`` runs it.
"""

from fp4convert.ranks.launch import launched_by_torchrun, process_group
from fp4convert.ranks.partition import contiguous_split, split_by_bytes
from fp4convert.ranks.team import RankTeam, Team, current_team

__all__ = [
    "RankTeam",
    "Team",
    "contiguous_split",
    "current_team",
    "launched_by_torchrun",
    "process_group",
    "split_by_bytes",
]
