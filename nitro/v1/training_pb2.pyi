from nitro.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class JobState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JOB_STATE_UNSPECIFIED: _ClassVar[JobState]
    JOB_STATE_PENDING: _ClassVar[JobState]
    JOB_STATE_RUNNING: _ClassVar[JobState]
    JOB_STATE_SUCCEEDED: _ClassVar[JobState]
    JOB_STATE_FAILED: _ClassVar[JobState]
    JOB_STATE_STOPPED: _ClassVar[JobState]
JOB_STATE_UNSPECIFIED: JobState
JOB_STATE_PENDING: JobState
JOB_STATE_RUNNING: JobState
JOB_STATE_SUCCEEDED: JobState
JOB_STATE_FAILED: JobState
JOB_STATE_STOPPED: JobState

class TrainingSpec(_message.Message):
    __slots__ = ("env_id", "algo", "preset", "hyperparameters", "scaler", "rounds", "steps_per_actor", "budget_usd", "seed", "eval_episodes", "round_deadline_s", "job_id", "actor_memory_mb", "function_name", "target_return", "min_sample_fraction", "detector_fallback", "detector_timeout_s", "learner_mode", "stellaris", "reproducible", "budget_clock", "eval_every", "hidden_sizes", "activation", "env_kwargs_json", "envs_per_actor", "vtrace_critic", "evaluation")
    class HyperparametersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    ENV_ID_FIELD_NUMBER: _ClassVar[int]
    ALGO_FIELD_NUMBER: _ClassVar[int]
    PRESET_FIELD_NUMBER: _ClassVar[int]
    HYPERPARAMETERS_FIELD_NUMBER: _ClassVar[int]
    SCALER_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    STEPS_PER_ACTOR_FIELD_NUMBER: _ClassVar[int]
    BUDGET_USD_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    EVAL_EPISODES_FIELD_NUMBER: _ClassVar[int]
    ROUND_DEADLINE_S_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ACTOR_MEMORY_MB_FIELD_NUMBER: _ClassVar[int]
    FUNCTION_NAME_FIELD_NUMBER: _ClassVar[int]
    TARGET_RETURN_FIELD_NUMBER: _ClassVar[int]
    MIN_SAMPLE_FRACTION_FIELD_NUMBER: _ClassVar[int]
    DETECTOR_FALLBACK_FIELD_NUMBER: _ClassVar[int]
    DETECTOR_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    LEARNER_MODE_FIELD_NUMBER: _ClassVar[int]
    STELLARIS_FIELD_NUMBER: _ClassVar[int]
    REPRODUCIBLE_FIELD_NUMBER: _ClassVar[int]
    BUDGET_CLOCK_FIELD_NUMBER: _ClassVar[int]
    EVAL_EVERY_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_SIZES_FIELD_NUMBER: _ClassVar[int]
    ACTIVATION_FIELD_NUMBER: _ClassVar[int]
    ENV_KWARGS_JSON_FIELD_NUMBER: _ClassVar[int]
    ENVS_PER_ACTOR_FIELD_NUMBER: _ClassVar[int]
    VTRACE_CRITIC_FIELD_NUMBER: _ClassVar[int]
    EVALUATION_FIELD_NUMBER: _ClassVar[int]
    env_id: str
    algo: str
    preset: str
    hyperparameters: _containers.ScalarMap[str, float]
    scaler: _common_pb2.ScalerSpec
    rounds: int
    steps_per_actor: int
    budget_usd: float
    seed: int
    eval_episodes: int
    round_deadline_s: float
    job_id: str
    actor_memory_mb: int
    function_name: str
    target_return: float
    min_sample_fraction: float
    detector_fallback: str
    detector_timeout_s: float
    learner_mode: str
    stellaris: StellarisSpec
    reproducible: bool
    budget_clock: str
    eval_every: int
    hidden_sizes: _containers.RepeatedScalarFieldContainer[int]
    activation: str
    env_kwargs_json: str
    envs_per_actor: int
    vtrace_critic: str
    evaluation: str
    def __init__(self, env_id: _Optional[str] = ..., algo: _Optional[str] = ..., preset: _Optional[str] = ..., hyperparameters: _Optional[_Mapping[str, float]] = ..., scaler: _Optional[_Union[_common_pb2.ScalerSpec, _Mapping]] = ..., rounds: _Optional[int] = ..., steps_per_actor: _Optional[int] = ..., budget_usd: _Optional[float] = ..., seed: _Optional[int] = ..., eval_episodes: _Optional[int] = ..., round_deadline_s: _Optional[float] = ..., job_id: _Optional[str] = ..., actor_memory_mb: _Optional[int] = ..., function_name: _Optional[str] = ..., target_return: _Optional[float] = ..., min_sample_fraction: _Optional[float] = ..., detector_fallback: _Optional[str] = ..., detector_timeout_s: _Optional[float] = ..., learner_mode: _Optional[str] = ..., stellaris: _Optional[_Union[StellarisSpec, _Mapping]] = ..., reproducible: _Optional[bool] = ..., budget_clock: _Optional[str] = ..., eval_every: _Optional[int] = ..., hidden_sizes: _Optional[_Iterable[int]] = ..., activation: _Optional[str] = ..., env_kwargs_json: _Optional[str] = ..., envs_per_actor: _Optional[int] = ..., vtrace_critic: _Optional[str] = ..., evaluation: _Optional[str] = ...) -> None: ...

class StellarisSpec(_message.Message):
    __slots__ = ("learner_function", "learner_memory_mb", "max_learners", "staleness_weight", "staleness_decay", "bound_start", "bound_end", "bound_schedule", "rho_bar", "recent_versions")
    LEARNER_FUNCTION_FIELD_NUMBER: _ClassVar[int]
    LEARNER_MEMORY_MB_FIELD_NUMBER: _ClassVar[int]
    MAX_LEARNERS_FIELD_NUMBER: _ClassVar[int]
    STALENESS_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    STALENESS_DECAY_FIELD_NUMBER: _ClassVar[int]
    BOUND_START_FIELD_NUMBER: _ClassVar[int]
    BOUND_END_FIELD_NUMBER: _ClassVar[int]
    BOUND_SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    RHO_BAR_FIELD_NUMBER: _ClassVar[int]
    RECENT_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    learner_function: str
    learner_memory_mb: int
    max_learners: int
    staleness_weight: str
    staleness_decay: float
    bound_start: int
    bound_end: int
    bound_schedule: str
    rho_bar: float
    recent_versions: int
    def __init__(self, learner_function: _Optional[str] = ..., learner_memory_mb: _Optional[int] = ..., max_learners: _Optional[int] = ..., staleness_weight: _Optional[str] = ..., staleness_decay: _Optional[float] = ..., bound_start: _Optional[int] = ..., bound_end: _Optional[int] = ..., bound_schedule: _Optional[str] = ..., rho_bar: _Optional[float] = ..., recent_versions: _Optional[int] = ...) -> None: ...

class RoundReport(_message.Message):
    __slots__ = ("job_id", "round", "policy_version", "actors_launched", "actors_completed", "actors_failed", "env_steps", "total_env_steps", "train_return", "eval_return", "lambda_max", "lambda_min", "convexity_ratio", "score", "round_cost_usd", "total_cost_usd", "serverful_cost_usd", "budget_left_usd", "phases", "round_seconds", "next_actors", "scaler_reason", "policy_loss", "value_loss", "entropy", "kl", "invocation_retries", "notes", "detector_seconds", "gradient_noise_scale", "actors_replaced", "fallback_plan", "duplicates_dropped", "rejected_batches", "stale_batches_dropped", "resumed", "gradients_produced", "gradients_applied", "gradients_dropped", "mean_staleness", "staleness_bound", "learner_functions_launched", "learner_functions_failed", "cloud_round_seconds", "cloud_round_cost_usd", "cloud_total_cost_usd", "cloud_phases", "evaluated", "learner_functions_skipped", "clip_fraction", "grad_norm", "explained_variance", "kl_coeff", "mean_episode_length", "cloud_actor_cost_usd", "policy_noise_scale", "learning_rate", "minibatch_size", "policy_grad_sq", "policy_trace_sigma", "eval_cost_usd", "cloud_eval_cost_usd")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    ACTORS_LAUNCHED_FIELD_NUMBER: _ClassVar[int]
    ACTORS_COMPLETED_FIELD_NUMBER: _ClassVar[int]
    ACTORS_FAILED_FIELD_NUMBER: _ClassVar[int]
    ENV_STEPS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_ENV_STEPS_FIELD_NUMBER: _ClassVar[int]
    TRAIN_RETURN_FIELD_NUMBER: _ClassVar[int]
    EVAL_RETURN_FIELD_NUMBER: _ClassVar[int]
    LAMBDA_MAX_FIELD_NUMBER: _ClassVar[int]
    LAMBDA_MIN_FIELD_NUMBER: _ClassVar[int]
    CONVEXITY_RATIO_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    ROUND_COST_USD_FIELD_NUMBER: _ClassVar[int]
    TOTAL_COST_USD_FIELD_NUMBER: _ClassVar[int]
    SERVERFUL_COST_USD_FIELD_NUMBER: _ClassVar[int]
    BUDGET_LEFT_USD_FIELD_NUMBER: _ClassVar[int]
    PHASES_FIELD_NUMBER: _ClassVar[int]
    ROUND_SECONDS_FIELD_NUMBER: _ClassVar[int]
    NEXT_ACTORS_FIELD_NUMBER: _ClassVar[int]
    SCALER_REASON_FIELD_NUMBER: _ClassVar[int]
    POLICY_LOSS_FIELD_NUMBER: _ClassVar[int]
    VALUE_LOSS_FIELD_NUMBER: _ClassVar[int]
    ENTROPY_FIELD_NUMBER: _ClassVar[int]
    KL_FIELD_NUMBER: _ClassVar[int]
    INVOCATION_RETRIES_FIELD_NUMBER: _ClassVar[int]
    NOTES_FIELD_NUMBER: _ClassVar[int]
    DETECTOR_SECONDS_FIELD_NUMBER: _ClassVar[int]
    GRADIENT_NOISE_SCALE_FIELD_NUMBER: _ClassVar[int]
    ACTORS_REPLACED_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_PLAN_FIELD_NUMBER: _ClassVar[int]
    DUPLICATES_DROPPED_FIELD_NUMBER: _ClassVar[int]
    REJECTED_BATCHES_FIELD_NUMBER: _ClassVar[int]
    STALE_BATCHES_DROPPED_FIELD_NUMBER: _ClassVar[int]
    RESUMED_FIELD_NUMBER: _ClassVar[int]
    GRADIENTS_PRODUCED_FIELD_NUMBER: _ClassVar[int]
    GRADIENTS_APPLIED_FIELD_NUMBER: _ClassVar[int]
    GRADIENTS_DROPPED_FIELD_NUMBER: _ClassVar[int]
    MEAN_STALENESS_FIELD_NUMBER: _ClassVar[int]
    STALENESS_BOUND_FIELD_NUMBER: _ClassVar[int]
    LEARNER_FUNCTIONS_LAUNCHED_FIELD_NUMBER: _ClassVar[int]
    LEARNER_FUNCTIONS_FAILED_FIELD_NUMBER: _ClassVar[int]
    CLOUD_ROUND_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CLOUD_ROUND_COST_USD_FIELD_NUMBER: _ClassVar[int]
    CLOUD_TOTAL_COST_USD_FIELD_NUMBER: _ClassVar[int]
    CLOUD_PHASES_FIELD_NUMBER: _ClassVar[int]
    EVALUATED_FIELD_NUMBER: _ClassVar[int]
    LEARNER_FUNCTIONS_SKIPPED_FIELD_NUMBER: _ClassVar[int]
    CLIP_FRACTION_FIELD_NUMBER: _ClassVar[int]
    GRAD_NORM_FIELD_NUMBER: _ClassVar[int]
    EXPLAINED_VARIANCE_FIELD_NUMBER: _ClassVar[int]
    KL_COEFF_FIELD_NUMBER: _ClassVar[int]
    MEAN_EPISODE_LENGTH_FIELD_NUMBER: _ClassVar[int]
    CLOUD_ACTOR_COST_USD_FIELD_NUMBER: _ClassVar[int]
    POLICY_NOISE_SCALE_FIELD_NUMBER: _ClassVar[int]
    LEARNING_RATE_FIELD_NUMBER: _ClassVar[int]
    MINIBATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    POLICY_GRAD_SQ_FIELD_NUMBER: _ClassVar[int]
    POLICY_TRACE_SIGMA_FIELD_NUMBER: _ClassVar[int]
    EVAL_COST_USD_FIELD_NUMBER: _ClassVar[int]
    CLOUD_EVAL_COST_USD_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    round: int
    policy_version: int
    actors_launched: int
    actors_completed: int
    actors_failed: int
    env_steps: int
    total_env_steps: int
    train_return: float
    eval_return: float
    lambda_max: float
    lambda_min: float
    convexity_ratio: float
    score: float
    round_cost_usd: float
    total_cost_usd: float
    serverful_cost_usd: float
    budget_left_usd: float
    phases: _containers.RepeatedCompositeFieldContainer[_common_pb2.PhaseLatency]
    round_seconds: float
    next_actors: int
    scaler_reason: str
    policy_loss: float
    value_loss: float
    entropy: float
    kl: float
    invocation_retries: int
    notes: _containers.RepeatedScalarFieldContainer[str]
    detector_seconds: float
    gradient_noise_scale: float
    actors_replaced: int
    fallback_plan: bool
    duplicates_dropped: int
    rejected_batches: int
    stale_batches_dropped: int
    resumed: bool
    gradients_produced: int
    gradients_applied: int
    gradients_dropped: int
    mean_staleness: float
    staleness_bound: int
    learner_functions_launched: int
    learner_functions_failed: int
    cloud_round_seconds: float
    cloud_round_cost_usd: float
    cloud_total_cost_usd: float
    cloud_phases: _containers.RepeatedCompositeFieldContainer[_common_pb2.PhaseLatency]
    evaluated: bool
    learner_functions_skipped: int
    clip_fraction: float
    grad_norm: float
    explained_variance: float
    kl_coeff: float
    mean_episode_length: float
    cloud_actor_cost_usd: float
    policy_noise_scale: float
    learning_rate: float
    minibatch_size: int
    policy_grad_sq: float
    policy_trace_sigma: float
    eval_cost_usd: float
    cloud_eval_cost_usd: float
    def __init__(self, job_id: _Optional[str] = ..., round: _Optional[int] = ..., policy_version: _Optional[int] = ..., actors_launched: _Optional[int] = ..., actors_completed: _Optional[int] = ..., actors_failed: _Optional[int] = ..., env_steps: _Optional[int] = ..., total_env_steps: _Optional[int] = ..., train_return: _Optional[float] = ..., eval_return: _Optional[float] = ..., lambda_max: _Optional[float] = ..., lambda_min: _Optional[float] = ..., convexity_ratio: _Optional[float] = ..., score: _Optional[float] = ..., round_cost_usd: _Optional[float] = ..., total_cost_usd: _Optional[float] = ..., serverful_cost_usd: _Optional[float] = ..., budget_left_usd: _Optional[float] = ..., phases: _Optional[_Iterable[_Union[_common_pb2.PhaseLatency, _Mapping]]] = ..., round_seconds: _Optional[float] = ..., next_actors: _Optional[int] = ..., scaler_reason: _Optional[str] = ..., policy_loss: _Optional[float] = ..., value_loss: _Optional[float] = ..., entropy: _Optional[float] = ..., kl: _Optional[float] = ..., invocation_retries: _Optional[int] = ..., notes: _Optional[_Iterable[str]] = ..., detector_seconds: _Optional[float] = ..., gradient_noise_scale: _Optional[float] = ..., actors_replaced: _Optional[int] = ..., fallback_plan: _Optional[bool] = ..., duplicates_dropped: _Optional[int] = ..., rejected_batches: _Optional[int] = ..., stale_batches_dropped: _Optional[int] = ..., resumed: _Optional[bool] = ..., gradients_produced: _Optional[int] = ..., gradients_applied: _Optional[int] = ..., gradients_dropped: _Optional[int] = ..., mean_staleness: _Optional[float] = ..., staleness_bound: _Optional[int] = ..., learner_functions_launched: _Optional[int] = ..., learner_functions_failed: _Optional[int] = ..., cloud_round_seconds: _Optional[float] = ..., cloud_round_cost_usd: _Optional[float] = ..., cloud_total_cost_usd: _Optional[float] = ..., cloud_phases: _Optional[_Iterable[_Union[_common_pb2.PhaseLatency, _Mapping]]] = ..., evaluated: _Optional[bool] = ..., learner_functions_skipped: _Optional[int] = ..., clip_fraction: _Optional[float] = ..., grad_norm: _Optional[float] = ..., explained_variance: _Optional[float] = ..., kl_coeff: _Optional[float] = ..., mean_episode_length: _Optional[float] = ..., cloud_actor_cost_usd: _Optional[float] = ..., policy_noise_scale: _Optional[float] = ..., learning_rate: _Optional[float] = ..., minibatch_size: _Optional[int] = ..., policy_grad_sq: _Optional[float] = ..., policy_trace_sigma: _Optional[float] = ..., eval_cost_usd: _Optional[float] = ..., cloud_eval_cost_usd: _Optional[float] = ...) -> None: ...

class TrainingStatus(_message.Message):
    __slots__ = ("job_id", "state", "spec", "rounds_done", "last_report", "message", "total_cost_usd", "total_env_steps", "checkpoint_path", "created_unix", "finished_unix", "cloud_total_cost_usd", "interrupted")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_DONE_FIELD_NUMBER: _ClassVar[int]
    LAST_REPORT_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TOTAL_COST_USD_FIELD_NUMBER: _ClassVar[int]
    TOTAL_ENV_STEPS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_PATH_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_FIELD_NUMBER: _ClassVar[int]
    FINISHED_UNIX_FIELD_NUMBER: _ClassVar[int]
    CLOUD_TOTAL_COST_USD_FIELD_NUMBER: _ClassVar[int]
    INTERRUPTED_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    state: JobState
    spec: TrainingSpec
    rounds_done: int
    last_report: RoundReport
    message: str
    total_cost_usd: float
    total_env_steps: int
    checkpoint_path: str
    created_unix: float
    finished_unix: float
    cloud_total_cost_usd: float
    interrupted: bool
    def __init__(self, job_id: _Optional[str] = ..., state: _Optional[_Union[JobState, str]] = ..., spec: _Optional[_Union[TrainingSpec, _Mapping]] = ..., rounds_done: _Optional[int] = ..., last_report: _Optional[_Union[RoundReport, _Mapping]] = ..., message: _Optional[str] = ..., total_cost_usd: _Optional[float] = ..., total_env_steps: _Optional[int] = ..., checkpoint_path: _Optional[str] = ..., created_unix: _Optional[float] = ..., finished_unix: _Optional[float] = ..., cloud_total_cost_usd: _Optional[float] = ..., interrupted: _Optional[bool] = ...) -> None: ...

class StartTrainingRequest(_message.Message):
    __slots__ = ("spec", "resume")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    RESUME_FIELD_NUMBER: _ClassVar[int]
    spec: TrainingSpec
    resume: bool
    def __init__(self, spec: _Optional[_Union[TrainingSpec, _Mapping]] = ..., resume: _Optional[bool] = ...) -> None: ...

class WatchTrainingRequest(_message.Message):
    __slots__ = ("job_id", "from_round")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_ROUND_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    from_round: int
    def __init__(self, job_id: _Optional[str] = ..., from_round: _Optional[int] = ...) -> None: ...

class GetTrainingRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class StopTrainingRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class ListTrainingsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListTrainingsResponse(_message.Message):
    __slots__ = ("jobs",)
    JOBS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[TrainingStatus]
    def __init__(self, jobs: _Optional[_Iterable[_Union[TrainingStatus, _Mapping]]] = ...) -> None: ...
