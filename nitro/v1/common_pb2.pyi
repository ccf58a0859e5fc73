from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class ScalerSpec(_message.Message):
    __slots__ = ("policy", "i_min", "i_max", "fixed_actors", "decay", "window", "period", "scheduler", "actors_by_round", "floor_actors", "floor_decay", "kappa", "grow_f1", "grow_f2")
    POLICY_FIELD_NUMBER: _ClassVar[int]
    I_MIN_FIELD_NUMBER: _ClassVar[int]
    I_MAX_FIELD_NUMBER: _ClassVar[int]
    FIXED_ACTORS_FIELD_NUMBER: _ClassVar[int]
    DECAY_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    PERIOD_FIELD_NUMBER: _ClassVar[int]
    SCHEDULER_FIELD_NUMBER: _ClassVar[int]
    ACTORS_BY_ROUND_FIELD_NUMBER: _ClassVar[int]
    FLOOR_ACTORS_FIELD_NUMBER: _ClassVar[int]
    FLOOR_DECAY_FIELD_NUMBER: _ClassVar[int]
    KAPPA_FIELD_NUMBER: _ClassVar[int]
    GROW_F1_FIELD_NUMBER: _ClassVar[int]
    GROW_F2_FIELD_NUMBER: _ClassVar[int]
    policy: str
    i_min: int
    i_max: int
    fixed_actors: int
    decay: float
    window: int
    period: int
    scheduler: str
    actors_by_round: str
    floor_actors: int
    floor_decay: float
    kappa: float
    grow_f1: float
    grow_f2: float
    def __init__(self, policy: _Optional[str] = ..., i_min: _Optional[int] = ..., i_max: _Optional[int] = ..., fixed_actors: _Optional[int] = ..., decay: _Optional[float] = ..., window: _Optional[int] = ..., period: _Optional[int] = ..., scheduler: _Optional[str] = ..., actors_by_round: _Optional[str] = ..., floor_actors: _Optional[int] = ..., floor_decay: _Optional[float] = ..., kappa: _Optional[float] = ..., grow_f1: _Optional[float] = ..., grow_f2: _Optional[float] = ...) -> None: ...

class PhaseLatency(_message.Message):
    __slots__ = ("phase", "seconds")
    PHASE_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    phase: str
    seconds: float
    def __init__(self, phase: _Optional[str] = ..., seconds: _Optional[float] = ...) -> None: ...
