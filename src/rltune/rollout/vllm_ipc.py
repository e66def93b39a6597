"""The trainer's side of vLLM's own `ipc` weight-transfer backend (`rollout.server.weight_transfer:
ipc`): a server on the trainer's own GPU takes each bucket of weights as CUDA IPC handles of the
trainer's tensors, without a copy through host memory (vLLM's `IPCWeightTransferEngine`, read in
vLLM 0.26's source: `/update_weights` with names, dtype names, shapes and the handles, pickled and
base64-encoded, one handle per tensor keyed by the GPU's UUID; the server must run with
`VLLM_ALLOW_INSECURE_SERIALIZATION=1` to unpickle them, which rltune sets for the server it starts:
every route of it takes the run's secret, so only this trainer can send it anything).

The tensors must stay alive until the `/update_weights` call returns (the server loads them in that
call): the caller keeps the bucket. NOT YET RUN ON A GPU."""

from __future__ import annotations

BACKEND = "ipc"   # vLLM's own name for it


def update_info(tensors: dict, reduce=None, gpu_uuid: str | None = None) -> dict:
    """The `update_info` of one `/update_weights` call for `tensors` (name -> CUDA tensor)."""
    import base64
    import pickle

    import torch

    if reduce is None:
        from torch.multiprocessing.reductions import reduce_tensor as reduce
    handles = []
    for t in tensors.values():
        if gpu_uuid is None:
            gpu_uuid = str(torch.cuda.get_device_properties(t.device).uuid)
        _, args = reduce(t)            # (rebuild_cuda_tensor, its arguments)
        handles.append({gpu_uuid: args})
    return {"names": list(tensors), "dtype_names": [str(t.dtype).removeprefix("torch.") for t in tensors.values()],
            "shapes": [list(t.shape) for t in tensors.values()],
            "ipc_handles_pickled": base64.b64encode(pickle.dumps(handles)).decode("ascii")}


def ipc_problem(device: str, srv) -> str | None:
    """Why rollout.server.weight_transfer ipc cannot work here, or None."""
    if device != "cuda":
        return "rollout.server.weight_transfer ipc moves CUDA tensors between processes on one GPU; the trainer runs on the CPU"
    if srv.devices:
        return ("rollout.server.weight_transfer ipc hands the server handles to tensors on the trainer's GPU; "
                "rollout.server.devices puts the server on other GPUs")
    return None
