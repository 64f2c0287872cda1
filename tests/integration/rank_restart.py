"""One rank of a two-rank group under ``torch.distributed.run`` (run by ``test_rank_restart.py``).

It joins the group (``init_group``) and all-reduces its rank + 1. On the first start rank 1 then dies,
so the launcher restarts both; on that restart rank 0 joins late, so rank 1 looks for its peer before
rank 0 has written anything for the new start (what a loaded machine does by chance)."""

from __future__ import annotations

import os
import time

from astraflow.training.distributed import Ranks, all_reduce_sum, init_group

LATE_S = 3.0
"""How late rank 0 joins on the restart: longer than gloo's connection retries to a dead address."""

ranks = Ranks.from_env()
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
if attempt == 1 and ranks.leader:
    time.sleep(LATE_S)
init_group(ranks)
[total] = all_reduce_sum([float(ranks.rank + 1)], ranks)
print(f"start {attempt} rank {ranks.rank} sum {total:g}", flush=True)
if attempt == 0 and ranks.rank == 1:
    os._exit(3)
