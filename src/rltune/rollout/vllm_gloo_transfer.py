"""The worker side of the `rltune_gloo` weight-transfer backend (vllm_plugin.py registers it).

For a server the trainer reaches over the network (another machine, `rollout.server.url`), where
`rltune_file`'s file would not be seen. At `/init_weight_transfer_engine` every worker of the
server joins a gloo process group with the trainer (rank 0) over TCP: a `TCPStore` the trainer
serves at `master_address:master_port`, ranks `rank_offset + worker index`, as vLLM's `nccl`
backend numbers them. Each `/update_weights` call is then one gloo broadcast of one flat byte
buffer from the trainer, its layout in the request: parameter names, dtypes, shapes and byte
offsets (64-byte aligned). Nothing is unpickled. Loaded as `rltune_file` loads (the model's own
`load_weights` between vLLM's layer-wise reload start and finish).
"""

from __future__ import annotations

import datetime
import math
from dataclasses import dataclass, field

import torch
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)

from .vllm_file_transfer import SentOverHTTP, load_into

GROUP_PREFIX = "rltune_gloo"


@dataclass
class GlooInitInfo(WeightTransferInitInfo):
    master_address: str = ""
    master_port: int = 0
    rank_offset: int = 1
    world_size: int = 2
    timeout_s: float = 300.0
    group_key: str = ""      # the run's secret part of the group's keys (sent over the authenticated init call)


@dataclass
class GlooUpdateInfo(WeightTransferUpdateInfo):
    names: list[str] = field(default_factory=list)
    dtypes: list[str] = field(default_factory=list)
    shapes: list[list[int]] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    nbytes: int = 0


def join_group(address: str, port: int, rank: int, world_size: int, timeout_s: float, is_master: bool,
               key: str = ""):
    """(store, gloo process group) of the trainer and the server's workers; outside any default
    torch.distributed world (neither side's own group is touched). The group's keys in the store
    carry `key`, a per-run secret the trainer sends in the authenticated init call: the store
    listens on every interface (torch's TCPStore has no bind address), and one who reaches it but
    lacks the key cannot take a rank in the group nor read what its members exchange."""
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=float(timeout_s))
    store = dist.TCPStore(address, port, world_size, is_master=is_master, timeout=timeout, wait_for_workers=False)
    prefix = f"{GROUP_PREFIX}/{key}" if key else GROUP_PREFIX
    return store, dist.ProcessGroupGloo(dist.PrefixStore(prefix, store), rank, world_size, timeout)


def broadcast(group, buf: torch.Tensor):
    """Start broadcasting `buf` from rank 0 (the trainer); returns the work to wait on."""
    import torch.distributed as dist

    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    return group.broadcast([buf], opts)


class GlooWeightTransferEngine(SentOverHTTP, WeightTransferEngine[GlooInitInfo, GlooUpdateInfo]):
    init_info_cls = GlooInitInfo
    update_info_cls = GlooUpdateInfo

    def init_transfer_engine(self, init_info: GlooInitInfo) -> None:
        pc = self.parallel_config
        rank = init_info.rank_offset + pc.data_parallel_index * pc.world_size + pc.rank
        self.store, self.group = join_group(init_info.master_address, init_info.master_port, rank,
                                            init_info.world_size, init_info.timeout_s, is_master=False,
                                            key=init_info.group_key)

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)

    def receive_weights(self, update_info: GlooUpdateInfo) -> None:
        if getattr(self, "group", None) is None:
            raise RuntimeError("rltune_gloo: no group: /init_weight_transfer_engine first")
        u = update_info
        if not (len(u.names) == len(u.dtypes) == len(u.shapes) == len(u.offsets)):
            raise ValueError("rltune_gloo: names, dtypes, shapes and offsets differ in length")
        buf = torch.empty(int(u.nbytes), dtype=torch.uint8)
        broadcast(self.group, buf).wait()
        weights = []
        for name, dtype_name, shape, offset in zip(u.names, u.dtypes, u.shapes, u.offsets):
            dtype = getattr(torch, dtype_name, None)
            if not isinstance(dtype, torch.dtype):
                raise ValueError(f"rltune_gloo: unknown dtype {dtype_name!r} for {name}")
            n = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
            if offset < 0 or offset + n > buf.numel():
                raise ValueError(f"rltune_gloo: {name} lies outside the buffer")
            weights.append((name, buf[offset:offset + n].view(dtype).view(shape).to(self.device)))
        load_into(self.model, weights)

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)

    def shutdown(self) -> None:
        self.group = self.store = None
