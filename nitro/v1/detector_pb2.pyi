from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class ScoreRequest(_message.Message):
    __slots__ = ("job_id", "round", "policy_version", "sample_ref", "algo", "clip", "subset_size", "lanczos_steps", "window", "decay", "seed", "normalize_advantages")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_REF_FIELD_NUMBER: _ClassVar[int]
    ALGO_FIELD_NUMBER: _ClassVar[int]
    CLIP_FIELD_NUMBER: _ClassVar[int]
    SUBSET_SIZE_FIELD_NUMBER: _ClassVar[int]
    LANCZOS_STEPS_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    DECAY_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    NORMALIZE_ADVANTAGES_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    round: int
    policy_version: int
    sample_ref: str
    algo: str
    clip: float
    subset_size: int
    lanczos_steps: int
    window: int
    decay: float
    seed: int
    normalize_advantages: bool
    def __init__(self, job_id: _Optional[str] = ..., round: _Optional[int] = ..., policy_version: _Optional[int] = ..., sample_ref: _Optional[str] = ..., algo: _Optional[str] = ..., clip: _Optional[float] = ..., subset_size: _Optional[int] = ..., lanczos_steps: _Optional[int] = ..., window: _Optional[int] = ..., decay: _Optional[float] = ..., seed: _Optional[int] = ..., normalize_advantages: _Optional[bool] = ...) -> None: ...

class ScoreResponse(_message.Message):
    __slots__ = ("lambda_max", "lambda_min", "convexity_ratio", "score", "converged", "convergence_delta", "samples_used", "seconds", "window", "cpu_seconds")
    LAMBDA_MAX_FIELD_NUMBER: _ClassVar[int]
    LAMBDA_MIN_FIELD_NUMBER: _ClassVar[int]
    CONVEXITY_RATIO_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    CONVERGED_FIELD_NUMBER: _ClassVar[int]
    CONVERGENCE_DELTA_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_USED_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    CPU_SECONDS_FIELD_NUMBER: _ClassVar[int]
    lambda_max: float
    lambda_min: float
    convexity_ratio: float
    score: float
    converged: bool
    convergence_delta: float
    samples_used: int
    seconds: float
    window: _containers.RepeatedScalarFieldContainer[float]
    cpu_seconds: float
    def __init__(self, lambda_max: _Optional[float] = ..., lambda_min: _Optional[float] = ..., convexity_ratio: _Optional[float] = ..., score: _Optional[float] = ..., converged: _Optional[bool] = ..., convergence_delta: _Optional[float] = ..., samples_used: _Optional[int] = ..., seconds: _Optional[float] = ..., window: _Optional[_Iterable[float]] = ..., cpu_seconds: _Optional[float] = ...) -> None: ...
