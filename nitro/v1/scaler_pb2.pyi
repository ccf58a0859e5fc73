from nitro.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PlanRequest(_message.Message):
    __slots__ = ("job_id", "round", "score", "scaler", "budget_usd", "steps_per_actor", "actor_memory_mb", "learner_seconds", "gradient_noise_scale", "fallback_actors", "learner_loss", "eval_return", "approx_kl", "update_seconds", "actor_seconds", "round_seconds", "target_return", "rounds", "cloud_learner_seconds", "budget_clock", "policy_noise_scale", "policy_grad_sq", "policy_trace_sigma", "env_steps", "algo", "final_eval_episodes", "eval_episode_steps")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    SCALER_FIELD_NUMBER: _ClassVar[int]
    BUDGET_USD_FIELD_NUMBER: _ClassVar[int]
    STEPS_PER_ACTOR_FIELD_NUMBER: _ClassVar[int]
    ACTOR_MEMORY_MB_FIELD_NUMBER: _ClassVar[int]
    LEARNER_SECONDS_FIELD_NUMBER: _ClassVar[int]
    GRADIENT_NOISE_SCALE_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_ACTORS_FIELD_NUMBER: _ClassVar[int]
    LEARNER_LOSS_FIELD_NUMBER: _ClassVar[int]
    EVAL_RETURN_FIELD_NUMBER: _ClassVar[int]
    APPROX_KL_FIELD_NUMBER: _ClassVar[int]
    UPDATE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ACTOR_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ROUND_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TARGET_RETURN_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    CLOUD_LEARNER_SECONDS_FIELD_NUMBER: _ClassVar[int]
    BUDGET_CLOCK_FIELD_NUMBER: _ClassVar[int]
    POLICY_NOISE_SCALE_FIELD_NUMBER: _ClassVar[int]
    POLICY_GRAD_SQ_FIELD_NUMBER: _ClassVar[int]
    POLICY_TRACE_SIGMA_FIELD_NUMBER: _ClassVar[int]
    ENV_STEPS_FIELD_NUMBER: _ClassVar[int]
    ALGO_FIELD_NUMBER: _ClassVar[int]
    FINAL_EVAL_EPISODES_FIELD_NUMBER: _ClassVar[int]
    EVAL_EPISODE_STEPS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    round: int
    score: float
    scaler: _common_pb2.ScalerSpec
    budget_usd: float
    steps_per_actor: int
    actor_memory_mb: int
    learner_seconds: float
    gradient_noise_scale: float
    fallback_actors: int
    learner_loss: float
    eval_return: float
    approx_kl: float
    update_seconds: float
    actor_seconds: float
    round_seconds: float
    target_return: float
    rounds: int
    cloud_learner_seconds: float
    budget_clock: str
    policy_noise_scale: float
    policy_grad_sq: float
    policy_trace_sigma: float
    env_steps: int
    algo: str
    final_eval_episodes: int
    eval_episode_steps: int
    def __init__(self, job_id: _Optional[str] = ..., round: _Optional[int] = ..., score: _Optional[float] = ..., scaler: _Optional[_Union[_common_pb2.ScalerSpec, _Mapping]] = ..., budget_usd: _Optional[float] = ..., steps_per_actor: _Optional[int] = ..., actor_memory_mb: _Optional[int] = ..., learner_seconds: _Optional[float] = ..., gradient_noise_scale: _Optional[float] = ..., fallback_actors: _Optional[int] = ..., learner_loss: _Optional[float] = ..., eval_return: _Optional[float] = ..., approx_kl: _Optional[float] = ..., update_seconds: _Optional[float] = ..., actor_seconds: _Optional[float] = ..., round_seconds: _Optional[float] = ..., target_return: _Optional[float] = ..., rounds: _Optional[int] = ..., cloud_learner_seconds: _Optional[float] = ..., budget_clock: _Optional[str] = ..., policy_noise_scale: _Optional[float] = ..., policy_grad_sq: _Optional[float] = ..., policy_trace_sigma: _Optional[float] = ..., env_steps: _Optional[int] = ..., algo: _Optional[str] = ..., final_eval_episodes: _Optional[int] = ..., eval_episode_steps: _Optional[int] = ...) -> None: ...

class PlanResponse(_message.Message):
    __slots__ = ("actors", "reason", "budget_exhausted", "estimated_round_cost_usd", "budget_left_usd", "eval_reserve_usd")
    ACTORS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    BUDGET_EXHAUSTED_FIELD_NUMBER: _ClassVar[int]
    ESTIMATED_ROUND_COST_USD_FIELD_NUMBER: _ClassVar[int]
    BUDGET_LEFT_USD_FIELD_NUMBER: _ClassVar[int]
    EVAL_RESERVE_USD_FIELD_NUMBER: _ClassVar[int]
    actors: int
    reason: str
    budget_exhausted: bool
    estimated_round_cost_usd: float
    budget_left_usd: float
    eval_reserve_usd: float
    def __init__(self, actors: _Optional[int] = ..., reason: _Optional[str] = ..., budget_exhausted: _Optional[bool] = ..., estimated_round_cost_usd: _Optional[float] = ..., budget_left_usd: _Optional[float] = ..., eval_reserve_usd: _Optional[float] = ...) -> None: ...

class LaunchRequest(_message.Message):
    __slots__ = ("job_id", "round", "policy_version", "actors", "steps_per_actor", "env_id", "seed", "function_name", "deadline_s", "actor_memory_mb", "wait", "slots", "wave", "kind", "payload_ref", "reset_episodes", "env_kwargs_json", "envs_per_actor", "learner", "evaluation")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    ACTORS_FIELD_NUMBER: _ClassVar[int]
    STEPS_PER_ACTOR_FIELD_NUMBER: _ClassVar[int]
    ENV_ID_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    FUNCTION_NAME_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_S_FIELD_NUMBER: _ClassVar[int]
    ACTOR_MEMORY_MB_FIELD_NUMBER: _ClassVar[int]
    WAIT_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    WAVE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_REF_FIELD_NUMBER: _ClassVar[int]
    RESET_EPISODES_FIELD_NUMBER: _ClassVar[int]
    ENV_KWARGS_JSON_FIELD_NUMBER: _ClassVar[int]
    ENVS_PER_ACTOR_FIELD_NUMBER: _ClassVar[int]
    LEARNER_FIELD_NUMBER: _ClassVar[int]
    EVALUATION_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    round: int
    policy_version: int
    actors: int
    steps_per_actor: int
    env_id: str
    seed: int
    function_name: str
    deadline_s: float
    actor_memory_mb: int
    wait: bool
    slots: _containers.RepeatedScalarFieldContainer[int]
    wave: int
    kind: str
    payload_ref: str
    reset_episodes: bool
    env_kwargs_json: str
    envs_per_actor: int
    learner: LearnerLaunch
    evaluation: EvalLaunch
    def __init__(self, job_id: _Optional[str] = ..., round: _Optional[int] = ..., policy_version: _Optional[int] = ..., actors: _Optional[int] = ..., steps_per_actor: _Optional[int] = ..., env_id: _Optional[str] = ..., seed: _Optional[int] = ..., function_name: _Optional[str] = ..., deadline_s: _Optional[float] = ..., actor_memory_mb: _Optional[int] = ..., wait: _Optional[bool] = ..., slots: _Optional[_Iterable[int]] = ..., wave: _Optional[int] = ..., kind: _Optional[str] = ..., payload_ref: _Optional[str] = ..., reset_episodes: _Optional[bool] = ..., env_kwargs_json: _Optional[str] = ..., envs_per_actor: _Optional[int] = ..., learner: _Optional[_Union[LearnerLaunch, _Mapping]] = ..., evaluation: _Optional[_Union[EvalLaunch, _Mapping]] = ...) -> None: ...

class EvalLaunch(_message.Message):
    __slots__ = ("episodes", "episodes_per_function")
    EPISODES_FIELD_NUMBER: _ClassVar[int]
    EPISODES_PER_FUNCTION_FIELD_NUMBER: _ClassVar[int]
    episodes: int
    episodes_per_function: int
    def __init__(self, episodes: _Optional[int] = ..., episodes_per_function: _Optional[int] = ...) -> None: ...

class LearnerLaunch(_message.Message):
    __slots__ = ("payload_ref", "memory_mb")
    PAYLOAD_REF_FIELD_NUMBER: _ClassVar[int]
    MEMORY_MB_FIELD_NUMBER: _ClassVar[int]
    payload_ref: str
    memory_mb: int
    def __init__(self, payload_ref: _Optional[str] = ..., memory_mb: _Optional[int] = ...) -> None: ...

class InvocationResult(_message.Message):
    __slots__ = ("invocation_id", "ok", "error_type", "error_message", "duration_ms", "billed_ms", "init_ms", "attempts", "modelled_ms", "modelled_init_ms", "modelled_cold", "episode_returns")
    INVOCATION_ID_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    ERROR_TYPE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    BILLED_MS_FIELD_NUMBER: _ClassVar[int]
    INIT_MS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    MODELLED_MS_FIELD_NUMBER: _ClassVar[int]
    MODELLED_INIT_MS_FIELD_NUMBER: _ClassVar[int]
    MODELLED_COLD_FIELD_NUMBER: _ClassVar[int]
    EPISODE_RETURNS_FIELD_NUMBER: _ClassVar[int]
    invocation_id: str
    ok: bool
    error_type: str
    error_message: str
    duration_ms: float
    billed_ms: int
    init_ms: float
    attempts: int
    modelled_ms: float
    modelled_init_ms: float
    modelled_cold: bool
    episode_returns: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, invocation_id: _Optional[str] = ..., ok: _Optional[bool] = ..., error_type: _Optional[str] = ..., error_message: _Optional[str] = ..., duration_ms: _Optional[float] = ..., billed_ms: _Optional[int] = ..., init_ms: _Optional[float] = ..., attempts: _Optional[int] = ..., modelled_ms: _Optional[float] = ..., modelled_init_ms: _Optional[float] = ..., modelled_cold: _Optional[bool] = ..., episode_returns: _Optional[_Iterable[float]] = ...) -> None: ...

class LaunchResponse(_message.Message):
    __slots__ = ("launched", "succeeded", "failed", "invocations", "cost_usd", "seconds", "retries", "dispatch_seconds", "cloud_seconds", "cloud_cost_usd", "recorded")
    LAUNCHED_FIELD_NUMBER: _ClassVar[int]
    SUCCEEDED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    INVOCATIONS_FIELD_NUMBER: _ClassVar[int]
    COST_USD_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    RETRIES_FIELD_NUMBER: _ClassVar[int]
    DISPATCH_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CLOUD_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CLOUD_COST_USD_FIELD_NUMBER: _ClassVar[int]
    RECORDED_FIELD_NUMBER: _ClassVar[int]
    launched: int
    succeeded: int
    failed: int
    invocations: _containers.RepeatedCompositeFieldContainer[InvocationResult]
    cost_usd: float
    seconds: float
    retries: int
    dispatch_seconds: float
    cloud_seconds: float
    cloud_cost_usd: float
    recorded: int
    def __init__(self, launched: _Optional[int] = ..., succeeded: _Optional[int] = ..., failed: _Optional[int] = ..., invocations: _Optional[_Iterable[_Union[InvocationResult, _Mapping]]] = ..., cost_usd: _Optional[float] = ..., seconds: _Optional[float] = ..., retries: _Optional[int] = ..., dispatch_seconds: _Optional[float] = ..., cloud_seconds: _Optional[float] = ..., cloud_cost_usd: _Optional[float] = ..., recorded: _Optional[int] = ...) -> None: ...

class GetCostRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class GetCostResponse(_message.Message):
    __slots__ = ("actor_cost_usd", "learner_cost_usd", "total_cost_usd", "serverful_cost_usd", "invocations", "billed_ms", "budget_usd", "budget_left_usd", "learner_function_cost_usd", "learner_function_invocations", "cloud_actor_cost_usd", "cloud_learner_cost_usd", "cloud_learner_function_cost_usd", "cloud_total_cost_usd", "cloud_serverful_cost_usd", "cloud_billed_ms", "cloud_seconds", "budget_clock", "eval_function_cost_usd", "eval_function_invocations", "cloud_eval_function_cost_usd")
    ACTOR_COST_USD_FIELD_NUMBER: _ClassVar[int]
    LEARNER_COST_USD_FIELD_NUMBER: _ClassVar[int]
    TOTAL_COST_USD_FIELD_NUMBER: _ClassVar[int]
    SERVERFUL_COST_USD_FIELD_NUMBER: _ClassVar[int]
    INVOCATIONS_FIELD_NUMBER: _ClassVar[int]
    BILLED_MS_FIELD_NUMBER: _ClassVar[int]
    BUDGET_USD_FIELD_NUMBER: _ClassVar[int]
    BUDGET_LEFT_USD_FIELD_NUMBER: _ClassVar[int]
    LEARNER_FUNCTION_COST_USD_FIELD_NUMBER: _ClassVar[int]
    LEARNER_FUNCTION_INVOCATIONS_FIELD_NUMBER: _ClassVar[int]
    CLOUD_ACTOR_COST_USD_FIELD_NUMBER: _ClassVar[int]
    CLOUD_LEARNER_COST_USD_FIELD_NUMBER: _ClassVar[int]
    CLOUD_LEARNER_FUNCTION_COST_USD_FIELD_NUMBER: _ClassVar[int]
    CLOUD_TOTAL_COST_USD_FIELD_NUMBER: _ClassVar[int]
    CLOUD_SERVERFUL_COST_USD_FIELD_NUMBER: _ClassVar[int]
    CLOUD_BILLED_MS_FIELD_NUMBER: _ClassVar[int]
    CLOUD_SECONDS_FIELD_NUMBER: _ClassVar[int]
    BUDGET_CLOCK_FIELD_NUMBER: _ClassVar[int]
    EVAL_FUNCTION_COST_USD_FIELD_NUMBER: _ClassVar[int]
    EVAL_FUNCTION_INVOCATIONS_FIELD_NUMBER: _ClassVar[int]
    CLOUD_EVAL_FUNCTION_COST_USD_FIELD_NUMBER: _ClassVar[int]
    actor_cost_usd: float
    learner_cost_usd: float
    total_cost_usd: float
    serverful_cost_usd: float
    invocations: int
    billed_ms: int
    budget_usd: float
    budget_left_usd: float
    learner_function_cost_usd: float
    learner_function_invocations: int
    cloud_actor_cost_usd: float
    cloud_learner_cost_usd: float
    cloud_learner_function_cost_usd: float
    cloud_total_cost_usd: float
    cloud_serverful_cost_usd: float
    cloud_billed_ms: int
    cloud_seconds: float
    budget_clock: str
    eval_function_cost_usd: float
    eval_function_invocations: int
    cloud_eval_function_cost_usd: float
    def __init__(self, actor_cost_usd: _Optional[float] = ..., learner_cost_usd: _Optional[float] = ..., total_cost_usd: _Optional[float] = ..., serverful_cost_usd: _Optional[float] = ..., invocations: _Optional[int] = ..., billed_ms: _Optional[int] = ..., budget_usd: _Optional[float] = ..., budget_left_usd: _Optional[float] = ..., learner_function_cost_usd: _Optional[float] = ..., learner_function_invocations: _Optional[int] = ..., cloud_actor_cost_usd: _Optional[float] = ..., cloud_learner_cost_usd: _Optional[float] = ..., cloud_learner_function_cost_usd: _Optional[float] = ..., cloud_total_cost_usd: _Optional[float] = ..., cloud_serverful_cost_usd: _Optional[float] = ..., cloud_billed_ms: _Optional[int] = ..., cloud_seconds: _Optional[float] = ..., budget_clock: _Optional[str] = ..., eval_function_cost_usd: _Optional[float] = ..., eval_function_invocations: _Optional[int] = ..., cloud_eval_function_cost_usd: _Optional[float] = ...) -> None: ...

class EndJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class EndJobResponse(_message.Message):
    __slots__ = ("user_deleted",)
    USER_DELETED_FIELD_NUMBER: _ClassVar[int]
    user_deleted: bool
    def __init__(self, user_deleted: _Optional[bool] = ...) -> None: ...
