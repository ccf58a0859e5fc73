"""Stellaris's signed records, as they travel through Redis between the parameter service
(learner_svc/parameter_service.py) and the learner functions (actor_fn/learner_handler.py): a learner's update or
skip record (`encode_update`, `decode_update`; signed with the invocation's key) and the service's staleness
record (`encode_staleness_record`, `decode_staleness_record`; signed with the job's read key).

The algorithm (nitro.algos.stellaris: the records' types, aggregation, staleness) stays tensors and rules; the
envelope and its checks (nitro.data.codec) are here, above it.
"""

from __future__ import annotations

import numpy as np

from nitro.algos.stellaris import UpdateRecord, base_staleness
from nitro.data import codec

UPDATE_FORMAT = 1


def encode_update(rec: UpdateRecord, key: bytes) -> bytes:
    g = None if rec.update is None else np.ascontiguousarray(rec.update, dtype=np.float32)
    return codec.encode((UPDATE_FORMAT, rec.invocation_id, int(rec.round), int(rec.base_version), int(rec.steps),
                         g, dict(rec.stats)), key)


def encode_staleness_record(record: dict, key: bytes) -> bytes:
    return codec.encode(record, key)


def decode_staleness_record(blob: bytes | None, key: bytes) -> dict | None:
    """The verified record, or None when there is none or it does not verify (a learner then computes:
    it skips only when it is certain)."""
    if blob is None:
        return None
    try:
        record = codec.decode(blob, key, max_size=16 << 20)
    except codec.PayloadError:
        return None
    return record if base_staleness(record, 0) is not None else None


def decode_update(payload: bytes, key: bytes, n_params: int, max_size: int = 256 << 20) -> UpdateRecord:
    """Verify and decode an update or a skip record; codec.PayloadError: bad MAC, bad shape, non-finite values."""
    obj = codec.decode(payload, key, max_size=max_size)
    if not (isinstance(obj, tuple) and len(obj) == 7 and obj[0] == UPDATE_FORMAT):
        raise codec.MalformedPayloadError("payload is not a learner update")
    _, inv, rnd, base, steps, g, stats = obj
    if not (isinstance(inv, str) and all(type(v) is int for v in (rnd, base, steps)) and isinstance(stats, dict)):
        raise codec.MalformedPayloadError("payload is not a learner update")
    if g is None and stats.get("skipped"):
        return UpdateRecord(inv, rnd, base, steps, None, stats)
    if not isinstance(g, np.ndarray) or g.dtype != np.float32 or g.shape != (n_params,):
        raise codec.MalformedPayloadError(f"update must be float32 of shape ({n_params},)")
    if not np.isfinite(g).all():
        raise codec.MalformedPayloadError("update has non-finite values")
    return UpdateRecord(inv, rnd, base, steps, g, stats)
