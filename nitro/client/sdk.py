"""Python client for the learner's TrainingService.

    from nitro.client.sdk import NitroClient
    with NitroClient() as client:  # the local system `nitro up` started; or NitroClient("host:port", token_file=...)
        status = client.start_training({"env_id": "CartPole-v1", "rounds": 3})
        for report in client.watch(status.job_id):
            print(report.round, report.eval_return, report.phases)

`watch` yields `RoundReport` and the other calls return `TrainingStatus`: thin
read-only wrappers around the proto messages. Attribute access falls through to
the message (`report.eval_return`), `phases` is a dict {phase: seconds} and
`to_dict()` gives plain Python values. `.proto` is the message itself.

With no target, the client calls $NITRO_TARGET, else the learner of the local
system running in the state dir ($NITRO_STATE_DIR, else .nitro), else
127.0.0.1:50051; `find_target` and `find_token` are that rule, which the
`nitro` command follows too.

Server errors raise `NitroRpcError` subclasses carrying the gRPC status
(`.code`) and the server's message (`.details`); an UNAUTHENTICATED one also
says where the local system keeps its token (`.hint`). A spec the client can already
tell is malformed raises `nitro.spec.InvalidSpec` before anything is sent; all
other validation (env ids, ranges) is the server's, so the client does not
need the user's environments installed.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import grpc

from nitro.local import system_state
from nitro.rpc import auth, grpc_util
from nitro.spec import TrainingSpec, dict_to_proto, to_proto
from nitro.v1 import training_pb2, training_pb2_grpc

DEFAULT_TARGET = "127.0.0.1:50051"
TARGET_ENV = "NITRO_TARGET"
WATCH_PATIENCE_S = 60.0  # how long `watch` waits for a learner that went away (a restart) to come back

# --- errors ---------------------------------------------------------------------------


class NitroRpcError(Exception):
    """A failed call: `.code` is the grpc.StatusCode, `.details` the server's message."""

    def __init__(self, code: grpc.StatusCode, details: str, method: str = "", target: str = "", hint: str = ""):
        self.code = code
        self.details = details or ""
        self.method = method
        self.target = target  # the learner address called, when known
        self.hint = hint  # what to do about it, when the client knows (UNAUTHENTICATED: where the token is)
        super().__init__(f"{code.name}: {self.details}" + (f" ({hint})" if hint else ""))


class InvalidArgumentError(NitroRpcError):
    pass


class NotFoundError(NitroRpcError):
    pass


class UnavailableError(NitroRpcError):
    pass


class FailedPreconditionError(NitroRpcError):
    pass


class ResourceExhaustedError(NitroRpcError):
    pass


class UnauthenticatedError(NitroRpcError):
    pass


_ERROR_BY_CODE = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPreconditionError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    grpc.StatusCode.UNAUTHENTICATED: UnauthenticatedError,
}


def map_rpc_error(err: grpc.RpcError, method: str = "", target: str = "", hint: str = "") -> NitroRpcError:
    """The typed exception for a grpc.RpcError (a call error exposes code() and details())."""
    code = err.code() if callable(getattr(err, "code", None)) else grpc.StatusCode.UNKNOWN
    details = err.details() if callable(getattr(err, "details", None)) else str(err)
    code = code or grpc.StatusCode.UNKNOWN
    return _ERROR_BY_CODE.get(code, NitroRpcError)(code, details or "", method, target, hint)


# --- results ----------------------------------------------------------------------------


class _Wrapper:
    __slots__ = ("proto",)  # not "message": TrainingStatus has a field of that name

    def __init__(self, proto: Any) -> None:
        object.__setattr__(self, "proto", proto)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.proto, name)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is read-only")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.to_dict()!r})"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.proto == self.proto

    def to_dict(self) -> dict[str, Any]:
        return message_to_dict(self.proto)


class RoundReport(_Wrapper):
    """One finished round (see training.proto RoundReport for the fields)."""

    __slots__ = ()

    @property
    def phases(self) -> dict[str, float]:
        """This machine's phase latencies (wall time on its shared cores)."""
        return {p.phase: p.seconds for p in self.proto.phases}

    @property
    def cloud_phases(self) -> dict[str, float]:
        """The same phases on the modelled cloud clock (docs/cost.md)."""
        return {p.phase: p.seconds for p in self.proto.cloud_phases}

    @property
    def notes(self) -> list[str]:
        return list(self.proto.notes)


class TrainingStatus(_Wrapper):
    """A job's state; `state_name` is e.g. "RUNNING", `finished` is True once it ended."""

    __slots__ = ()

    @property
    def state_name(self) -> str:
        return _state_name(self.proto.state)

    @property
    def finished(self) -> bool:
        return self.proto.state in _FINAL_STATES

    @property
    def last_report(self) -> RoundReport | None:
        return RoundReport(self.proto.last_report) if self.proto.HasField("last_report") else None


_FINAL_STATES = {training_pb2.JOB_STATE_SUCCEEDED, training_pb2.JOB_STATE_FAILED, training_pb2.JOB_STATE_STOPPED}


def _state_name(value: int) -> str:
    return training_pb2.JobState.Name(value).removeprefix("JOB_STATE_")


def message_to_dict(msg: Any) -> dict[str, Any]:
    """Proto message -> plain dict; phases become {phase: seconds}, enums their names, every field present."""
    out: dict[str, Any] = {}
    for f in msg.DESCRIPTOR.fields:
        value = getattr(msg, f.name)
        if f.name in ("phases", "cloud_phases"):
            out[f.name] = {p.phase: p.seconds for p in value}
        elif f.message_type is not None and f.message_type.GetOptions().map_entry:
            out[f.name] = dict(value)
        elif f.is_repeated:
            out[f.name] = [message_to_dict(v) if hasattr(v, "DESCRIPTOR") else v for v in value]
        elif f.message_type is not None:
            out[f.name] = message_to_dict(value) if msg.HasField(f.name) else None
        elif f.enum_type is not None:
            out[f.name] = _state_name(value) if f.enum_type.name == "JobState" else f.enum_type.values_by_number[value].name
        else:
            out[f.name] = value
    return out


# --- specs ------------------------------------------------------------------------------

def spec_to_proto(spec: TrainingSpec | Mapping[str, Any] | training_pb2.TrainingSpec) -> training_pb2.TrainingSpec:
    """TrainingSpec dataclass, partial dict or proto -> proto, by the spec's own conversions (nitro.spec.to_proto,
    nitro.spec.dict_to_proto: a dict sets only the fields it names, so the server's defaults apply to the rest)."""
    if isinstance(spec, training_pb2.TrainingSpec):
        return spec
    if isinstance(spec, TrainingSpec):
        return to_proto(spec)
    if not isinstance(spec, Mapping):
        raise TypeError(f"spec must be a TrainingSpec, a dict or a nitro.v1 TrainingSpec, not {type(spec).__name__}")
    return dict_to_proto(spec)


# --- where the learner is, and its token --------------------------------------------------


def find_target(target: str | None = None, state_dir: str | os.PathLike | None = None) -> str | None:
    """The learner to call: `target`, else $NITRO_TARGET, else the learner of the local system running in
    `state_dir` (default: $NITRO_STATE_DIR, else .nitro); None when there is none of them."""
    if target:
        return target
    if os.environ.get(TARGET_ENV):
        return os.environ[TARGET_ENV]
    state = system_state.running_state(_state_dir(state_dir))
    return (state or {}).get("learner") or None


@dataclasses.dataclass(frozen=True)
class FoundToken:
    """The access token a client sends (None: no header) and where it came from, for error messages."""

    token: str | None
    source: str  # e.g. "the local system's token file /x/.nitro/token"; "" when there is no token


def find_token(target: str, *, token: str | None = None, token_file: str | os.PathLike | None = None,
               state_dir: str | os.PathLike | None = None, environ: Mapping[str, str] = os.environ) -> FoundToken:
    """The token for `target`: `token`; else the first of `token_file`; else the token of the local system
    running in `state_dir` (default: $NITRO_STATE_DIR, else .nitro) when `target` is its learner (a local
    system's token goes to its own learner only); else $NITRO_TOKEN or $NITRO_TOKEN_FILE's; else that of a
    LocalSystem this process started at `target`. A bad token file raises nitro.errors.ConfigError."""
    if token:
        return FoundToken(token, "the token given")
    if token_file:
        path = os.fspath(token_file)
        return FoundToken(auth.read_token_file(path, f"token_file {path!r}")[0], f"token_file {path}")
    state_dir = _state_dir(state_dir)
    state = system_state.running_state(state_dir)
    if state and state.get("learner") == target:
        local = system_state.local_token(state_dir)
        if local:
            return FoundToken(local, f"the local system's token file {_token_path(state_dir, state)}")
    env = auth.load_token(environ)
    if env:
        where = auth.TOKEN_ENV if environ.get(auth.TOKEN_ENV) else \
            f"{auth.TOKEN_FILE_ENV}={environ[auth.TOKEN_FILE_ENV]}"
        return FoundToken(env, f"${where}")
    in_process = auth.client_token(target, None, environ={})
    return FoundToken(in_process, "the local system this process started" if in_process else "")


def _state_dir(state_dir: str | os.PathLike | None) -> str | os.PathLike:
    return state_dir if state_dir is not None else system_state.default_state_dir()


def _token_path(state_dir: str | os.PathLike, state: dict | None) -> str:
    """The token file of the local system in `state_dir`: the one state.json names, else where it would be."""
    return str((state or {}).get("token_file") or system_state.token_file(Path(state_dir).resolve()))


def unauthenticated_hint(target: str, sent: FoundToken, state_dir: str | os.PathLike | None = None) -> str:
    """What an UNAUTHENTICATED answer from `target` calls for: what this client sent, where a local system
    keeps its access token and how to pass it."""
    state_dir = _state_dir(state_dir)
    state = system_state.running_state(state_dir)
    path = _token_path(state_dir, state)
    sent_line = f"this client sent the token from {sent.source}" if sent.token else "this client sent no access token"
    if state and state.get("learner") and state["learner"] != target:
        where = f"the local system up in {state_dir} (its learner is {state['learner']}) keeps its token in {path}"
    elif state:
        where = f"the local system up in {state_dir} keeps its token in {path}"
    else:
        where = f"a local system started by `nitro up` keeps its token in {path} (with --state-dir DIR: DIR/token)"
    return (f"{sent_line}; {where}: pass NitroClient(token_file={path!r}) (nitro: --token-file {path}), "
            f"or set {auth.TOKEN_FILE_ENV}={path}")


# --- client -----------------------------------------------------------------------------


# What a call gets from a learner that went away: UNAVAILABLE (restarting, unreachable), or CANCELLED (a learner
# shutting down cancels the calls and streams still open; this client cancels a call only after leaving it).
LEARNER_AWAY = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED})


class NitroClient:
    """A TrainingService client. Every call carries a deadline (per method, or `timeout` seconds
    for all unary calls when given) and an "authorization: Bearer <token>" header.

    `target` (host:port): default $NITRO_TARGET, else the learner of the local system running in
    `state_dir` (default $NITRO_STATE_DIR, else .nitro), else 127.0.0.1:50051 (`find_target`). The token:
    `token`, else the first line of `token_file`, else the local system's when `target` is its learner,
    else $NITRO_TOKEN or the first line of $NITRO_TOKEN_FILE, else that of a LocalSystem this process
    started at `target` (`find_token`); with none, no header is sent. `tls_ca` (default $NITRO_TLS_CA):
    a PEM CA certificate, and the channel uses TLS.
    """

    def __init__(self, target: str | None = None, *, token: str | None = None,
                 token_file: str | os.PathLike | None = None, state_dir: str | os.PathLike | None = None,
                 timeout: float | None = None, tls_ca: str | None = None) -> None:
        self._state_dir = state_dir
        self.target: str = find_target(target, state_dir) or DEFAULT_TARGET
        self._timeout = timeout
        self._token = find_token(self.target, token=token, token_file=token_file, state_dir=state_dir)
        self._metadata = (("authorization", f"Bearer {self._token.token}"),) if self._token.token else None
        tls_ca = tls_ca if tls_ca is not None else os.environ.get(auth.TLS_CA_ENV)
        self._channel = grpc_util.make_channel(self.target, auth.channel_credentials(tls_ca))
        self._stub = training_pb2_grpc.TrainingServiceStub(self._channel)

    @property
    def token_source(self) -> str:
        """Where the token this client sends came from ("" when it sends none); never the token itself."""
        return self._token.source

    def _error(self, err: grpc.RpcError, method: str) -> NitroRpcError:
        exc = map_rpc_error(err, method, self.target)
        if isinstance(exc, UnauthenticatedError):  # say where the token is
            hint = unauthenticated_hint(self.target, self._token, self._state_dir)
            return UnauthenticatedError(exc.code, exc.details, method, self.target, hint)
        return exc

    def __enter__(self) -> NitroClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._channel.close()

    def _call(self, method: str, request: Any) -> Any:
        timeout = self._timeout if self._timeout is not None else grpc_util.DEADLINES[method]
        try:
            return getattr(self._stub, method)(request, timeout=timeout, metadata=self._metadata)
        except grpc.RpcError as err:
            raise self._error(err, method) from None

    def start_training(self, spec: TrainingSpec | Mapping[str, Any] | training_pb2.TrainingSpec) -> TrainingStatus:
        request = training_pb2.StartTrainingRequest(spec=spec_to_proto(spec))
        return TrainingStatus(self._call("StartTraining", request))

    def resume(self, job_id: str) -> TrainingStatus:
        """Continue an interrupted job from its last checkpoint (model, optimiser, round, RNG, budget spent);
        a job the learner is running already (it resumed it after a restart) is returned as it is."""
        request = training_pb2.StartTrainingRequest(spec=training_pb2.TrainingSpec(job_id=job_id), resume=True)
        return TrainingStatus(self._call("StartTraining", request))

    def get(self, job_id: str) -> TrainingStatus:
        return TrainingStatus(self._call("GetTraining", training_pb2.GetTrainingRequest(job_id=job_id)))

    def stop(self, job_id: str) -> TrainingStatus:
        return TrainingStatus(self._call("StopTraining", training_pb2.StopTrainingRequest(job_id=job_id)))

    def list(self) -> list[TrainingStatus]:
        return [TrainingStatus(j) for j in self._call("ListTrainings", training_pb2.ListTrainingsRequest()).jobs]

    def serving(self, timeout: float = 2.0) -> bool:
        """Whether the learner answers its health check with SERVING (False while it drains to shut down, or
        when it cannot be reached)."""
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        try:
            resp = health_pb2_grpc.HealthStub(self._channel).Check(health_pb2.HealthCheckRequest(), timeout=timeout)
        except grpc.RpcError:
            return False
        return resp.status == health_pb2.HealthCheckResponse.SERVING

    def watch(self, job_id: str, from_round: int = 0, *, patience_s: float = WATCH_PATIENCE_S,
              on_wait: Callable[[NitroRpcError, float], None] | None = None) -> Iterator[RoundReport]:
        """Round reports from `from_round` on, until the job ends.

        If the stream breaks with UNAVAILABLE (learner restarting, network blip) or
        CANCELLED (a learner shutting down cancels its streams) it is
        reopened after the last round received, with backoff, for up to `patience_s`
        seconds; meanwhile NOT_FOUND counts as "not back yet" too (a restarted learner
        lists its jobs just after it starts serving). Before each retry,
        `on_wait(error, seconds waited)` is called (a progress line; raising in it gives
        up). Closing the iterator cancels the stream.
        """
        next_round, tries = from_round, 0
        lost_since: float | None = None  # when the learner went away (monotonic), while it is away
        while True:
            call = self._stub.WatchTraining(
                training_pb2.WatchTrainingRequest(job_id=job_id, from_round=next_round),
                timeout=grpc_util.DEADLINES["WatchTraining"], metadata=self._metadata)
            try:
                call.initial_metadata()  # returns once the stream is open (the learner sends it first) or ended
                if not call.done():
                    lost_since, tries = None, 0  # reached the learner: a later break is a new outage
                for msg in call:
                    lost_since, tries = None, 0
                    if msg.round < next_round:  # already yielded (before a reconnect)
                        continue
                    next_round = msg.round + 1
                    yield RoundReport(msg)
                return
            except grpc.RpcError as err:
                code, now = err.code(), time.monotonic()
                away = code in LEARNER_AWAY or (code == grpc.StatusCode.NOT_FOUND and lost_since is not None)
                if not away:
                    raise self._error(err, "WatchTraining") from None
                lost_since = lost_since if lost_since is not None else now
                if now - lost_since >= patience_s:
                    raise self._error(err, "WatchTraining") from None
                tries += 1
                if on_wait is not None:
                    on_wait(self._error(err, "WatchTraining"), now - lost_since)
                time.sleep(min(0.5 * 2 ** tries, 5.0))
            finally:
                call.cancel()
