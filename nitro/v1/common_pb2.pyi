from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class ScalerSpec(_message.Message):
    __slots__ = ("policy", "i_min", "i_max", "fixed_actors", "decay", "window", "period", "scheduler")
    POLICY_FIELD_NUMBER: _ClassVar[int]
    I_MIN_FIELD_NUMBER: _ClassVar[int]
    I_MAX_FIELD_NUMBER: _ClassVar[int]
    FIXED_ACTORS_FIELD_NUMBER: _ClassVar[int]
    DECAY_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    PERIOD_FIELD_NUMBER: _ClassVar[int]
    SCHEDULER_FIELD_NUMBER: _ClassVar[int]
    policy: str
    i_min: int
    i_max: int
    fixed_actors: int
    decay: float
    window: int
    period: int
    scheduler: str
    def __init__(self, policy: _Optional[str] = ..., i_min: _Optional[int] = ..., i_max: _Optional[int] = ..., fixed_actors: _Optional[int] = ..., decay: _Optional[float] = ..., window: _Optional[int] = ..., period: _Optional[int] = ..., scheduler: _Optional[str] = ...) -> None: ...

class PhaseLatency(_message.Message):
    __slots__ = ("phase", "seconds")
    PHASE_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    phase: str
    seconds: float
    def __init__(self, phase: _Optional[str] = ..., seconds: _Optional[float] = ...) -> None: ...
