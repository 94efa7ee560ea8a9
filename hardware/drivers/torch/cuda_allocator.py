"""Where a CUDA address lives in PyTorch's caching allocator: segment, block, stream, pool.

The allocator carves cudaMalloc'd segments into blocks and caches freed blocks for reuse per
stream and pool, so one address holds many values over a run. `block_at` answers from a
snapshot (`torch.cuda.memory_snapshot(include_traces=False)`), taken on demand, never per write.
"""

from __future__ import annotations

from typing import Any


def block_at(segments: list[dict], address: int, device: int | None = None) -> dict[str, Any]:
    """The segment and block of `segments` (a snapshot) that hold `address`; {} if none does (not allocator
    memory, or on another device when `device` is given)."""
    for seg in segments:
        base = seg["address"]
        if not base <= address < base + seg["total_size"] or device not in (None, seg.get("device", device)):
            continue
        start = base
        for block in seg["blocks"]:
            start = block.get("address", start)
            if start <= address < start + block["size"]:
                return {"segment": hex(base), "segment_size": seg["total_size"], "block": hex(start),
                        "block_size": block["size"], "requested_size": block.get("requested_size"),
                        "block_state": block["state"], "offset_in_block": address - start,
                        "stream": seg.get("stream"), "pool": _pool(seg)}
            start += block["size"]
        return {"segment": hex(base), "segment_size": seg["total_size"], "stream": seg.get("stream"),
                "pool": _pool(seg)}
    return {}


def _pool(seg: dict) -> str:
    """'large' or 'small' (the allocator's two default pools), or the private pool a CUDA graph owns."""
    kind = seg.get("segment_type", "")
    pool_id = tuple(seg.get("segment_pool_id") or (0, 0))
    return kind if pool_id == (0, 0) else f"{kind} (private pool {pool_id[0]}:{pool_id[1]})"
