"""SDK, CLI and results writers without running services: flags -> spec, errors, files written."""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import socket
import subprocess
import sys

import grpc
import pytest

from nitro.client import cli, results, sdk
from nitro.client.commands import common, train
from nitro.local import processes, secret_files, system_state
from nitro.spec import InvalidSpec, ScalerSettings, StellarisSettings, TrainingSpec
from nitro.v1 import common_pb2, training_pb2


def parse_train(*flags: str):
    return cli.build_parser().parse_args(["train", *flags])


def spec_of(*flags: str) -> dict:
    return train.build_spec(parse_train(*flags))


# --- nitro train flags -> spec ---------------------------------------------------------------


def test_only_given_flags_are_set():
    spec = spec_of("--env", "CartPole-v1", "--rounds", "3", "--budget", "2.5")
    assert spec == {"env_id": "CartPole-v1", "rounds": 3, "budget_usd": 2.5}
    msg = sdk.spec_to_proto(spec)
    assert msg.env_id == "CartPole-v1" and msg.rounds == 3 and msg.budget_usd == 2.5
    for unset in ("seed", "steps_per_actor", "eval_episodes", "round_deadline_s", "target_return"):
        assert not msg.HasField(unset), unset
    assert not msg.HasField("scaler")
    assert msg.algo == "" and msg.preset == "" and not msg.hyperparameters  # server defaults apply


def test_every_spec_field_has_a_flag():
    covered = {f for _, f, _, _ in train.TRAIN_FIELDS} | {"scaler.policy", "hyperparameters", "reproducible", "env_kwargs"}
    wanted = {f.name for f in dataclasses.fields(TrainingSpec) if f.name not in ("scaler", "stellaris")}
    wanted |= {f"scaler.{f.name}" for f in dataclasses.fields(ScalerSettings)}
    wanted |= {f"stellaris.{f.name}" for f in dataclasses.fields(StellarisSettings)}
    assert covered == wanted


def test_reproducible_flag_reaches_the_proto_and_back():
    from nitro.spec import from_proto, to_proto

    assert "reproducible" not in spec_of("--env", "CartPole-v1")
    msg = sdk.spec_to_proto(spec_of("--env", "CartPole-v1", "--reproducible"))
    assert msg.HasField("reproducible") and msg.reproducible
    spec = from_proto(msg)
    assert spec.reproducible and to_proto(spec).reproducible
    assert not from_proto(sdk.spec_to_proto({"env_id": "CartPole-v1"})).reproducible


def test_control_scaler_settings_reach_the_proto_and_back():
    from nitro.spec import from_proto, to_proto, validate

    spec = spec_of("--env", "CartPole-v1", "--scaler", "replay", "--actors-by-round", "8,16,12")
    assert spec["scaler"] == {"policy": "replay", "actors_by_round": "8,16,12"}
    back = validate(from_proto(sdk.spec_to_proto(spec)))
    assert (back.scaler.policy, back.scaler.actors_by_round) == ("replay", "8,16,12")
    assert to_proto(back).scaler.actors_by_round == "8,16,12"
    assert sdk.spec_to_proto({"env_id": "CartPole-v1", "scaler": dataclasses.asdict(back.scaler)}) \
        .scaler.actors_by_round == "8,16,12"  # a dataclass's fields pass through the SDK's dict path

    spec = spec_of("--env", "CartPole-v1", "--scaler", "nitro-floor", "--floor-actors", "32", "--floor-decay", "0.9")
    back = validate(from_proto(sdk.spec_to_proto(spec)))
    assert (back.scaler.policy, back.scaler.floor_actors, back.scaler.floor_decay) == ("nitro-floor", 32, 0.9)
    assert from_proto(to_proto(back)).scaler == back.scaler
    defaults = validate(from_proto(sdk.spec_to_proto({"env_id": "CartPole-v1", "scaler": "schedule"})))
    assert (defaults.scaler.floor_actors, defaults.scaler.floor_decay, defaults.scaler.actors_by_round) == \
        (64, 0.96, "")


@pytest.mark.parametrize("scaler,field", [
    ({"policy": "replay"}, "scaler.actors_by_round"),
    ({"policy": "replay", "actors_by_round": "8,,16"}, "scaler.actors_by_round"),
    ({"policy": "replay", "actors_by_round": "8,0"}, "scaler.actors_by_round"),
    ({"policy": "replay", "actors_by_round": "8,5000"}, "scaler.actors_by_round"),
    ({"policy": "nitro", "actors_by_round": "8"}, "scaler.actors_by_round"),
    ({"policy": "nitro-floor", "floor_actors": 0}, "scaler.floor_actors"),
    ({"policy": "nitro-floor", "floor_decay": 1.5}, "scaler.floor_decay"),
    ({"policy": "schedule", "decay": 0.0}, "scaler.decay"),
])
def test_control_scaler_settings_are_validated(scaler, field):
    from nitro.spec import from_proto, validate

    with pytest.raises(InvalidSpec) as exc:
        validate(from_proto(sdk.spec_to_proto({"env_id": "CartPole-v1", "scaler": scaler})))
    assert exc.value.field == field


def test_all_flags_reach_the_proto():
    spec = spec_of("--env", "Hopper-v5", "--algo", "ppo", "--preset", "fast", "--scaler", "nitro",
                   "--i-min", "4", "--i-max", "32", "--decay", "0.9", "--window", "5", "--period", "7",
                   "--fixed-actors", "12", "--rounds", "9", "--steps-per-actor", "128", "--budget", "1",
                   "--seed", "3", "--eval-episodes", "2", "--round-deadline", "30", "--job-id", "my-job",
                   "--actor-memory", "2048", "--function", "other-fn", "--target-return", "3000",
                   "--min-sample-fraction", "0.75", "--hp", "lr=1e-3")
    msg = sdk.spec_to_proto(spec)
    assert (msg.scaler.policy, msg.scaler.i_min, msg.scaler.i_max) == ("nitro", 4, 32)
    assert msg.scaler.decay == pytest.approx(0.9) and msg.scaler.window == 5 and msg.scaler.period == 7
    assert msg.scaler.fixed_actors == 12
    assert (msg.rounds, msg.steps_per_actor, msg.seed, msg.eval_episodes) == (9, 128, 3, 2)
    assert (msg.job_id, msg.actor_memory_mb, msg.function_name, msg.preset) == ("my-job", 2048, "other-fn", "fast")
    assert msg.round_deadline_s == 30 and msg.target_return == 3000 and msg.min_sample_fraction == 0.75
    assert dict(msg.hyperparameters) == {"lr": pytest.approx(1e-3)}


def test_fixed_shorthand():
    spec = spec_of("--env", "CartPole-v1", "--scaler", "fixed:16")
    assert spec["scaler"] == {"policy": "fixed", "fixed_actors": 16}
    msg = sdk.spec_to_proto(spec)
    assert msg.scaler.policy == "fixed" and msg.scaler.fixed_actors == 16 and not msg.scaler.HasField("i_min")


def test_fixed_shorthand_conflicting_with_fixed_actors():
    with pytest.raises(InvalidSpec, match="disagree"):
        spec_of("--env", "CartPole-v1", "--scaler", "fixed:16", "--fixed-actors", "8")


@pytest.mark.parametrize("bad", ["fixed:x", "max:4", ":3", ""])
def test_bad_scaler_flag(bad, capsys):
    with pytest.raises(SystemExit) as exc:
        parse_train("--env", "CartPole-v1", "--scaler", bad)
    assert exc.value.code == 2
    assert "--scaler" in capsys.readouterr().err


def test_hp_parsing():
    spec = spec_of("--env", "CartPole-v1", "--hp", "lr=3e-4", "--hp", "epochs=4", "--hp", "obs_norm=true")
    assert spec["hyperparameters"] == {"lr": 3e-4, "epochs": 4.0, "obs_norm": 1.0}


@pytest.mark.parametrize("bad,message", [("lr=abc", "must be a number"), ("lr", "NAME=VALUE"),
                                         ("=1", "NAME=VALUE"), ("lr=nan", "finite")])
def test_bad_hp_value(bad, message, capsys):
    with pytest.raises(SystemExit) as exc:
        parse_train("--env", "CartPole-v1", "--hp", bad)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_missing_env_is_bad_input(capsys):
    assert cli.main(["train", "--target", "127.0.0.1:1", "--rounds", "2"]) == 2
    assert capsys.readouterr().err.strip().startswith("error: INVALID_ARGUMENT: env_id")


def test_local_train_refuses_a_bad_spec_before_it_starts_a_system(tmp_path, capsys):
    state = tmp_path / "state"
    argv = ["train", "--local", "--state-dir", str(state), "--env", "Hopper-v5", "--rounds", "1"]
    assert cli.main([*argv, "--scaler", "bogus"]) == 2
    out, err = capsys.readouterr()
    assert err.strip().startswith("error: INVALID_ARGUMENT: scaler.policy: unknown scaling policy 'bogus'")
    assert "local system up" not in out and not list(state.glob("*"))  # nothing was started
    assert cli.main([*argv, "--i-min", "10", "--i-max", "4"]) == 2
    assert "error: INVALID_ARGUMENT: scaler.i_min: must be <= scaler.i_max (4)" in capsys.readouterr().err


def test_spec_refusals_carry_the_learners_status():
    from nitro.scaling.minions import SchedulerMismatchError
    from nitro.spec import refusal

    assert refusal(InvalidSpec("rounds", "must be >= 1")) == ("INVALID_ARGUMENT", "rounds: must be >= 1")
    assert refusal(SchedulerMismatchError("trained for i_max=4")) == \
        ("FAILED_PRECONDITION", "scaler.scheduler: trained for i_max=4")


def test_spec_to_proto_checks():
    with pytest.raises(InvalidSpec, match="unknown field"):
        sdk.spec_to_proto({"env_id": "CartPole-v1", "roundz": 3})
    with pytest.raises(InvalidSpec, match="rounds"):
        sdk.spec_to_proto({"env_id": "CartPole-v1", "rounds": "three"})
    with pytest.raises(InvalidSpec, match="scaler.foo"):
        sdk.spec_to_proto({"env_id": "CartPole-v1", "scaler": {"foo": 1}})
    full = sdk.spec_to_proto(TrainingSpec(env_id="CartPole-v1", rounds=4))
    assert full.rounds == 4 and full.HasField("seed")  # a dataclass sends every field


# --- errors -----------------------------------------------------------------------------------


class FakeRpcError(grpc.RpcError):
    def __init__(self, code, details):
        self._code, self._details = code, details

    def code(self):
        return self._code

    def details(self):
        return self._details


@pytest.mark.parametrize("code,cls", [
    (grpc.StatusCode.INVALID_ARGUMENT, sdk.InvalidArgumentError),
    (grpc.StatusCode.NOT_FOUND, sdk.NotFoundError),
    (grpc.StatusCode.UNAVAILABLE, sdk.UnavailableError),
    (grpc.StatusCode.FAILED_PRECONDITION, sdk.FailedPreconditionError),
    (grpc.StatusCode.RESOURCE_EXHAUSTED, sdk.ResourceExhaustedError),
    (grpc.StatusCode.UNAUTHENTICATED, sdk.UnauthenticatedError),
    (grpc.StatusCode.INTERNAL, sdk.NitroRpcError),
])
def test_error_mapping(code, cls):
    err = sdk.map_rpc_error(FakeRpcError(code, "rounds: must be in [1, 100000], got 0"))
    assert type(err) is cls and isinstance(err, sdk.NitroRpcError)
    assert err.code is code and err.details == "rounds: must be in [1, 100000], got 0"
    assert str(err) == f"{code.name}: rounds: must be in [1, 100000], got 0"


class FakeStub:
    """Records calls; raises or answers as told."""

    def __init__(self, answers):
        self.answers, self.calls = answers, []

    def __getattr__(self, method):
        def call(request, timeout=None, metadata=None):
            self.calls.append((method, request, timeout, metadata))
            answer = self.answers[method]
            if isinstance(answer, list):  # a stream: one list of messages/errors per call
                return FakeStream(answer.pop(0))
            if isinstance(answer, Exception):
                raise answer
            return answer

        return call


class FakeStream:
    def __init__(self, items):
        self.items, self.cancelled = items, False

    def initial_metadata(self):
        return ()

    def done(self):  # like a real stream that failed before it opened
        return bool(self.items) and isinstance(self.items[0], Exception)

    def __iter__(self):
        for item in self.items:
            if isinstance(item, Exception):
                raise item
            yield item

    def cancel(self):
        self.cancelled = True


def make_client(answers, **kw) -> tuple[sdk.NitroClient, FakeStub]:
    client = sdk.NitroClient("127.0.0.1:1", **kw)
    client._stub = FakeStub(answers)
    return client


def test_client_raises_typed_errors_with_deadline_and_token():
    client = make_client({"GetTraining": FakeRpcError(grpc.StatusCode.NOT_FOUND, "no job 'x'")}, token="s3cret")
    with client, pytest.raises(sdk.NotFoundError, match="no job 'x'") as exc:
        client.get("x")
    assert exc.value.code is grpc.StatusCode.NOT_FOUND
    method, request, timeout, metadata = client._stub.calls[0]
    assert method == "GetTraining" and request.job_id == "x"
    assert timeout == sdk.grpc_util.DEADLINES["GetTraining"]
    assert metadata == (("authorization", "Bearer s3cret"),)


def test_client_wraps_results():
    status = training_pb2.TrainingStatus(job_id="j", state=training_pb2.JOB_STATE_SUCCEEDED, message="done")
    client = make_client({"StopTraining": status, "ListTrainings": training_pb2.ListTrainingsResponse(jobs=[status])},
                         timeout=3.0)
    stopped = client.stop("j")
    assert stopped.job_id == "j" and stopped.message == "done" and stopped.state_name == "SUCCEEDED"
    assert stopped.finished and stopped.proto == status
    assert [j.job_id for j in client.list()] == ["j"]
    assert all(c[2] == 3.0 for c in client._stub.calls)  # one timeout for every unary call
    assert client._stub.calls[0][3] is None  # no token, no metadata


def report(i: int, **kw) -> training_pb2.RoundReport:
    base = dict(job_id="job-1", round=i, actors_launched=8 + i, actors_completed=8 + i, env_steps=100,
                total_env_steps=100 * (i + 1), train_return=float(i), eval_return=10.0 * i,
                total_cost_usd=0.01 * (i + 1), serverful_cost_usd=0.05 * (i + 1), score=0.5,
                phases=[common_pb2.PhaseLatency(phase="sample", seconds=1.0 + i),
                        common_pb2.PhaseLatency(phase="update", seconds=0.5)],
                cloud_phases=[common_pb2.PhaseLatency(phase="sample", seconds=0.25)])
    base.update(kw)
    return training_pb2.RoundReport(**base)


def test_watch_resumes_after_unavailable(monkeypatch):
    monkeypatch.setattr(sdk.time, "sleep", lambda s: None)
    broken = FakeRpcError(grpc.StatusCode.UNAVAILABLE, "learner restarting")
    client = make_client({"WatchTraining": [[report(0), broken], [report(1), report(2)]]})
    got = list(client.watch("job-1"))
    assert [r.round for r in got] == [0, 1, 2]
    assert got[0].phases == {"sample": 1.0, "update": 0.5}
    assert [c[1].from_round for c in client._stub.calls] == [0, 1]


def test_watch_resumes_after_a_shutdown_cancelled_the_stream(monkeypatch):
    """A learner that shuts down cancels the streams still open: that is the learner going away, not an error."""
    monkeypatch.setattr(sdk.time, "sleep", lambda s: None)
    cancelled = FakeRpcError(grpc.StatusCode.CANCELLED, "Cancelled")
    client = make_client({"WatchTraining": [[report(0), cancelled], [report(1)]]})
    assert [r.round for r in client.watch("job-1")] == [0, 1]


def test_watch_raises_other_errors():
    client = make_client({"WatchTraining": [[FakeRpcError(grpc.StatusCode.NOT_FOUND, "no job")]]})
    with pytest.raises(sdk.NotFoundError):
        list(client.watch("nope"))


# --- results ----------------------------------------------------------------------------------


def test_rounds_csv(tmp_path):
    reports = [sdk.RoundReport(report(0, notes=["deadline hit", "fallback"])), sdk.RoundReport(report(1))]
    path = results.write_rounds_csv(tmp_path / "out" / "rounds.csv", reports)
    with open(path) as f:
        rows = list(csv.DictReader(f))
    fields = [f.name for f in training_pb2.RoundReport.DESCRIPTOR.fields if f.name not in ("phases", "cloud_phases")]
    assert list(rows[0]) == fields + ["phase_sample_s", "phase_update_s", "cloud_phase_sample_s"]
    assert [r["round"] for r in rows] == ["0", "1"]
    assert float(rows[1]["phase_sample_s"]) == 2.0 and rows[0]["notes"] == "deadline hit; fallback"
    assert float(rows[1]["cloud_phase_sample_s"]) == 0.25  # the cloud clock's phases, named apart


def test_rounds_csv_empty_has_header(tmp_path):
    path = results.write_rounds_csv(tmp_path / "rounds.csv", [])
    header = path.read_text().splitlines()
    assert len(header) == 1 and header[0].startswith("job_id,round,")


def test_summary(tmp_path):
    reports = [report(0), report(1, eval_return=50.0), report(2, eval_return=20.0)]
    status = training_pb2.TrainingStatus(job_id="job-1", state=training_pb2.JOB_STATE_SUCCEEDED,
                                         message="completed 3 rounds", total_cost_usd=0.03, total_env_steps=300,
                                         checkpoint_path="/x/ckpt.pt",
                                         spec=sdk.spec_to_proto(TrainingSpec(env_id="CartPole-v1", rounds=3)))
    summary = results.write_summary(tmp_path / "summary.json", sdk.TrainingStatus(status), reports, 12.5)
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk == json.loads(json.dumps(summary))
    for key in ("job_id", "state", "message", "rounds", "final_eval_return", "best_eval_return", "best_round",
                "total_env_steps", "total_cost_usd", "serverful_cost_usd", "wall_s", "checkpoint_path", "spec"):
        assert key in on_disk, key
    assert on_disk["state"] == "SUCCEEDED" and on_disk["rounds"] == 3 and on_disk["rounds_planned"] == 3
    assert on_disk["final_eval_return"] == 20.0 and on_disk["best_eval_return"] == 50.0 and on_disk["best_round"] == 1
    assert on_disk["serverful_cost_usd"] == pytest.approx(0.15) and on_disk["wall_s"] == 12.5


@pytest.mark.parametrize("n", [0, 1, 5])
def test_plot_is_a_png(tmp_path, n):
    path = results.plot_training(tmp_path / "training.png", [report(i) for i in range(n)])
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000


def test_plot_accepts_dicts(tmp_path):
    rows = [sdk.RoundReport(report(i)).to_dict() for i in range(3)]
    assert results.plot_training(tmp_path / "t.png", rows).exists()


# --- nitro train end to end against a fake client ------------------------------------------------


class FakeClient:
    def __init__(self, target, token=None, **kw):
        self.target, self.stopped = target, False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def start_training(self, spec):
        self.spec = spec
        return sdk.TrainingStatus(training_pb2.TrainingStatus(
            job_id="job-1", state=training_pb2.JOB_STATE_RUNNING, spec=sdk.spec_to_proto(
                {**spec, "rounds": 3, "algo": "ppo", "scaler": {"policy": "nitro"}})))

    def watch(self, job_id, from_round=0, **kw):
        for i in range(3):
            yield sdk.RoundReport(report(i))

    def get(self, job_id):
        return sdk.TrainingStatus(training_pb2.TrainingStatus(
            job_id=job_id, state=training_pb2.JOB_STATE_SUCCEEDED, message="completed 3 rounds",
            checkpoint_path=FakeClient.checkpoint, total_cost_usd=0.03, total_env_steps=300))


def test_train_writes_results(tmp_path, monkeypatch, capsys):
    ckpt = tmp_path / "server" / "checkpoint.pt"
    ckpt.parent.mkdir()
    ckpt.write_bytes(b"weights")
    FakeClient.checkpoint = str(ckpt)
    monkeypatch.setattr(common, "NitroClient", FakeClient)
    out = tmp_path / "results"
    rc = cli.main(["train", "--target", "h:1", "--env", "CartPole-v1", "--results-dir", str(out), "--no-progress"])
    assert rc == 0
    job_dir = out / "job-1"
    assert sorted(p.name for p in job_dir.iterdir()) == ["checkpoint.pt", "rounds.csv", "summary.json",
                                                          "training.png"]
    assert (job_dir / "checkpoint.pt").read_bytes() == b"weights"
    assert json.loads((job_dir / "summary.json").read_text())["state"] == "SUCCEEDED"
    text = capsys.readouterr().out
    assert "round    2" in text and "SUCCEEDED: completed 3 rounds" in text


@pytest.mark.parametrize("code,rc", [(grpc.StatusCode.INVALID_ARGUMENT, 2), (grpc.StatusCode.UNAVAILABLE, 1),
                                     (grpc.StatusCode.INTERNAL, 1)])
def test_train_server_errors_are_one_line(monkeypatch, capsys, code, rc):
    def fail(self, spec):
        raise sdk.map_rpc_error(FakeRpcError(code, "scaler.i_min: must be <= scaler.i_max (3), got 9"))

    monkeypatch.setattr(FakeClient, "start_training", fail)
    monkeypatch.setattr(common, "NitroClient", FakeClient)
    assert cli.main(["train", "--target", "h:1", "--env", "CartPole-v1", "--i-min", "9", "--i-max", "3"]) == rc
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith(f"error: {code.name}: scaler.i_min: must be <= scaler.i_max (3), got 9")


def test_train_without_a_system_says_how_to_start_one(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("NITRO_TARGET", raising=False)
    assert cli.main(["train", "--state-dir", str(tmp_path), "--env", "CartPole-v1"]) == 1
    assert "nitro up" in capsys.readouterr().err


# --- up / down / status without a system -----------------------------------------------------------


def test_down_when_nothing_is_up(tmp_path, capsys):
    assert cli.main(["down", "--state-dir", str(tmp_path / "nothing")]) == 0
    assert "not up" in capsys.readouterr().out


def test_down_cleans_stale_state(tmp_path, capsys):
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    dead = proc.pid  # a pid that no longer runs
    (tmp_path / system_state.STATE_FILE).write_text(json.dumps({"supervisor_pid": dead, "components": {}}))
    (tmp_path / secret_files.HMAC_KEY_FILE).write_text("k")
    assert cli.main(["down", "--state-dir", str(tmp_path)]) == 0
    assert "stale" in capsys.readouterr().out
    assert not (tmp_path / system_state.STATE_FILE).exists()
    assert (tmp_path / secret_files.HMAC_KEY_FILE).exists(), "secrets outlive the system (rotate_secrets removes them)"


def test_status_when_nothing_is_up(tmp_path, capsys):
    assert cli.main(["status", "--state-dir", str(tmp_path)]) == 1
    assert "not up" in capsys.readouterr().out


def test_listens_on_tells_our_socket_from_others():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        if processes.listens_on(os.getpid(), port) is None:
            pytest.skip("no /proc")
        assert processes.listens_on(os.getpid(), port) is True
        assert processes.listens_on(os.getpid(), processes.free_port()) is False


def test_secret_files_are_private(tmp_path):
    path = tmp_path / "hmac.key"
    secret_files.write_secret(path, "abc")
    assert path.stat().st_mode & 0o777 == 0o600 and path.read_text() == "abc\n"


@pytest.mark.parametrize("written,parsed", [("nitro", ("nitro", None)), ("fixed", ("fixed", None)),
                                            ("fixed:16", ("fixed", 16)), (" fixed:4 ", ("fixed", 4))])
def test_the_one_parser_of_the_policy_shorthand(written, parsed):
    """CLI flag, spec file and wire read "fixed:N" through nitro.spec.parse_policy, and refuse alike."""
    from nitro.spec import from_proto, parse_policy
    from nitro.spec_file import normalise
    from nitro.v1 import common_pb2, training_pb2

    assert parse_policy(written) == parsed
    assert normalise({"scaler": written})["scaler"] == {"policy": parsed[0], **(
        {"fixed_actors": parsed[1]} if parsed[1] is not None else {})}
    wire = from_proto(training_pb2.TrainingSpec(env_id="CartPole-v1", scaler=common_pb2.ScalerSpec(policy=written)))
    assert wire.scaler.policy == parsed[0] and (parsed[1] is None or wire.scaler.fixed_actors == parsed[1])


@pytest.mark.parametrize("bad", ["fixed:x", "nitro:4", "max:"])
def test_a_count_on_another_policy_or_no_number_is_refused_everywhere(bad):
    from nitro.spec import from_proto, parse_policy
    from nitro.spec_file import normalise
    from nitro.v1 import common_pb2, training_pb2

    for read, field in ((lambda: parse_policy(bad), "scaler.policy"), (lambda: normalise({"scaler": bad}), "scaler"),
                        (lambda: from_proto(training_pb2.TrainingSpec(
                            env_id="CartPole-v1", scaler=common_pb2.ScalerSpec(policy=bad))), "scaler.policy")):
        with pytest.raises(InvalidSpec) as err:
            read()
        assert err.value.field == field and "'fixed:16'" in err.value.detail
