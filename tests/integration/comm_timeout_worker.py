"""msrun worker of tests/integration/test_mindspore_compat.py: rank 1 sends 35 s late; rank 0's receive must wait for it
(the runtime's Comm raises MCCL's 30 s receive timeout, hyperparallel.runtime.compat.comm_timeouts)."""
import json
import os
import sys
import time

from hyperparallel.runtime import compat

compat.setup_device("CPU")
from hyperparallel.runtime.comm import Comm  # noqa: E402

DELAY_S = 35.0
comm = Comm(1)
out = {"rank": comm.rank, "MS_NODE_TIMEOUT": os.environ.get("MS_NODE_TIMEOUT")}
if comm.rank == 1:
    import mindspore as ms
    time.sleep(DELAY_S)
    comm.send(ms.Tensor([1.0, 2.0, 3.0], ms.float32), 0)
else:
    t0 = time.perf_counter()
    got = comm.recv((3,), 1)
    out.update(waited_s=time.perf_counter() - t0, got=got.asnumpy().tolist())
compat.barrier()
with open(os.path.join(sys.argv[1], f"rank{comm.rank}.json"), "w") as f:
    json.dump(out, f)
