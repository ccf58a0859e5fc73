"""nitro.contracts: the key layout, ids and shared defaults every process agrees on."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nitro import contracts as c
from nitro.detector import hvp, score
from nitro.scaling.base import RoundInputs
from nitro.scaling.policies import FixedPolicy, NitroFloorPolicy, SchedulePolicy
from nitro.spec import ScalerSettings

JOB_IDS = st.from_regex(r"[A-Za-z0-9_-]{1,64}", fullmatch=True)


def test_key_layout():
    assert c.policy_key("j", 7) == "nitro:j:policy:7"
    assert c.latest_policy_key("j") == "nitro:j:policy:latest"
    assert c.stream_key("j") == "nitro:j:traj"
    assert c.seen_key("j") == "nitro:j:seen"
    assert c.sample_key("j", 3) == "nitro:j:sample:3"
    assert c.waves_key("j", 3) == "nitro:j:waves:3"
    assert c.launches_key("j", 3) == "nitro:j:launches:3"
    assert c.launch_owner_key("j", "0123456789abcdef") == "nitro:j:launch-owner:0123456789abcdef"
    assert c.detector_ratios_key("j") == "nitro:j:detector:ratios"
    assert c.scaler_state_key("j") == "nitro:j:scaler"
    assert c.learn_counter_key("j") == "nitro:j:learn:counter"
    assert c.parcel_key("j", "j-r1-g2") == "nitro:j:learn:parcel:j-r1-g2"
    assert c.update_stream_key("j") == "nitro:j:learn:updates"


@given(JOB_IDS, JOB_IDS)
def test_a_jobs_acl_patterns_cover_exactly_what_its_functions_touch_of_that_job_only(job, other):
    import fnmatch

    allowed = lambda key: any(fnmatch.fnmatchcase(key, p) for p in c.actor_key_patterns(job))  # noqa: E731
    assert allowed(c.stream_key(job)) and allowed(c.policy_key(job, 1)) and allowed(c.latest_policy_key(job))
    assert allowed(c.parcel_key(job, "i")) and allowed(c.update_stream_key(job)) and allowed(c.staleness_record_key(job))
    for private in (c.seen_key(job), c.scaler_state_key(job), c.sample_key(job, 0), c.detector_ratios_key(job),
                    c.launches_key(job, 0), c.learn_counter_key(job).replace(":learn:", ":other:")):
        assert not allowed(private), private
        assert fnmatch.fnmatchcase(private, c.ALL_KEYS_PATTERN)
    if other != job:  # nothing of another job, whatever the two ids (job ids hold no glob character)
        for key in (c.stream_key(other), c.policy_key(other, 1), c.parcel_key(other, "i"), c.update_stream_key(other)):
            assert not allowed(key), (job, key)
    assert c.job_of_actor_user(c.actor_user(job)) == job and c.job_of_actor_user("nitro-service") is None


def test_derived_keys_are_bound_to_their_job_and_invocation():
    master = b"m" * 32
    key = c.invocation_key(master, "a", "a-r3-a0")
    assert len(key) == 32 and key == c.invocation_key(master, "a", "a-r3-a0")
    others = {c.invocation_key(master, "b", "a-r3-a0"), c.invocation_key(master, "a", "a-r3-a1"),
              c.invocation_key(master, "a", "a-r3-a0-x1"), c.invocation_key(b"n" * 32, "a", "a-r3-a0"),
              c.job_read_key(master, "a"), c.job_read_key(master, "b")}
    assert key not in others and len(others) == 6
    with pytest.raises(ValueError, match="job_id"):
        c.invocation_key(master, "a|b", "x")
    with pytest.raises(ValueError, match="invocation"):
        c.invocation_key(master, "a", "")
    with pytest.raises(TypeError, match="master"):
        c.job_read_key(b"", "a")
    creds = c.function_credentials(master, "a", "a-r3-a0", "p" * 32)
    assert "p" * 32 not in repr(creds) and key.hex() not in repr(creds)
    assert c.FunctionCredentials.from_event({"credentials": creds.to_event()}, "a") == creds


@pytest.mark.parametrize("bad", ["", "a" * 65, "a:b", "a*", "a b", "j\n", "../x", None, 7, "ü"])
def test_bad_job_ids_are_rejected(bad):
    assert not c.is_job_id(bad)
    with pytest.raises(ValueError, match="job_id"):
        c.check_job_id(bad)
    with pytest.raises(ValueError):
        c.stream_key(bad)
    with pytest.raises(ValueError):
        c.invocation_id(bad, 0, 0)


@pytest.mark.parametrize("version", [-1, True, 1.0, "1"])
def test_bad_policy_versions_are_rejected(version):
    with pytest.raises(ValueError, match="version"):
        c.policy_key("j", version)


def test_learn_keys_belong_to_their_job():
    assert c.is_learn_key("j", c.parcel_key("j", "x"))
    assert not c.is_learn_key("j", c.parcel_key("j2", "x"))
    assert not c.is_learn_key("j", "nitro:j:policy:1")
    assert not c.is_learn_key("j:", "nitro:j::learn:x")  # an invalid job id owns nothing


def test_invocation_id_format():
    assert c.invocation_id("job-1", 4, 2) == "job-1-r4-a2"
    assert c.invocation_id("job-1", 4, 2, 3) == "job-1-r4-a2-x3"
    assert c.invocation_id("job-1", 4, 5, kind="learner") == "job-1-r4-g5"


@given(JOB_IDS, st.integers(0, 10**6), st.integers(0, 10**4), st.integers(0, 50), st.sampled_from(["actor", "learner"]))
def test_invocation_id_round_trip(job_id, k, slot, wave, kind):
    text = c.invocation_id(job_id, k, slot, wave, kind=kind)
    inv = c.parse_invocation_id(text)
    assert inv == c.InvocationId(job_id, k, slot, kind, wave)
    assert str(inv) == text


@pytest.mark.parametrize("bad", ["", "job", "job-r1", "job-r1-a", "job-r-a1", "job-r1-b2", "job-r1-a2-x0", "job-r1-a2-x",
                                 "job-r1-a2-y3", "job r1-a2", "job-r1-a2\n", "-r1-a2", "job-r01x-a2", None, 5])
def test_bad_invocation_ids_are_rejected(bad):
    assert c.parse_invocation_id(bad) is None


def test_bad_invocation_id_parts_are_rejected():
    for args, kw in [((("j", -1, 0)), {}), (("j", 0, -1), {}), (("j", 0, 0, -1), {}), (("j", 0, 0), {"kind": "critic"})]:
        with pytest.raises(ValueError):
            c.invocation_id(*args, **kw)


def test_actor_slot_of_this_job_and_round_only():
    assert c.actor_slot("j-r3-a7-x2", "j", 3) == 7
    assert c.actor_slot("j-r3-a7", "j", 4) is None
    assert c.actor_slot("j-r3-a7", "i", 3) is None
    assert c.actor_slot("j-r3-g7", "j", 3) is None  # a learner function, not an actor
    assert c.actor_slot("a-r1-a2-r3-a7", "a-r1-a2", 3) == 7  # a job id that looks like an invocation id


def test_defaults_have_one_home():
    sc = ScalerSettings()
    assert (sc.fixed_actors, sc.decay, sc.window, sc.period) == (0, c.SCORE_DECAY, c.SCORE_WINDOW,
                                                                 c.HYDROZOA_PERIOD)  # 0: the algorithm's count
    assert (sc.floor_actors, sc.floor_decay) == (c.FLOOR_ACTORS, c.FLOOR_DECAY)
    assert (sc.i_min, sc.i_max) == (RoundInputs(0).i_min, RoundInputs(0).i_max) == (c.DEFAULT_I_MIN, c.DEFAULT_I_MAX)
    assert FixedPolicy().actors == c.FIXED_ACTORS and SchedulePolicy().decay == c.SCORE_DECAY
    assert (NitroFloorPolicy().floor_actors, NitroFloorPolicy().floor_decay) == (c.FLOOR_ACTORS, c.FLOOR_DECAY)
    assert (sc.kappa, (sc.grow_f1, sc.grow_f2)) == (c.NOISE_KAPPA, c.GROW_FRACTIONS)
    assert hvp.select_subset.__defaults__[0] == c.DETECTOR_SUBSET
    assert score.ScoreWindow().size == c.SCORE_WINDOW
    assert c.SCALING_POLICIES[0] == "nitro" and len(set(c.SCALING_POLICIES)) == len(c.SCALING_POLICIES)


def test_default_scaler_is_the_algorithms_fixed_count_everywhere():
    """The default scaling policy (issue 14: a fixed count won on return at equal modelled dollars, docs/results.md:
    8 actors for PPO, 16 for IMPACT) lives in nitro.contracts only: the spec, the scaler service's empty policy and
    the CLI all resolve to it."""
    from learner_svc.clients import scaler_spec
    from nitro.client import cli, sdk
    from nitro.client.commands import train
    from nitro.scaling.policies import make_policy
    from nitro.spec import TrainingSpec, from_proto, validate
    from nitro.v1 import common_pb2
    from scaler_svc.server import policy_params

    # The decision itself; change it on purpose.
    assert (c.DEFAULT_SCALING_POLICY, c.FIXED_ACTORS, c.FIXED_ACTORS_BY_ALGO) == ("fixed", 8, {"ppo": 8, "impact": 16})
    assert c.DEFAULT_SCALING_POLICY in c.SCALING_POLICIES
    assert [c.default_fixed_actors(a) for a in ("ppo", "impact", "other")] == [8, 16, c.FIXED_ACTORS]
    inputs = RoundInputs(0, score=1.0, i_min=8, i_max=64)  # a full score: a score-driven policy would say 64

    def actors(name: str, params: dict) -> int:
        return make_policy(name, params).decide({}, inputs)[0]

    for algo, count in c.FIXED_ACTORS_BY_ALGO.items():
        # The spec: a job that names no scaler, as a dataclass, through the CLI and the SDK's dict.
        sc = validate(TrainingSpec(env_id="CartPole-v1", algo=algo)).scaler
        assert (sc.policy, sc.fixed_actors) == (c.DEFAULT_SCALING_POLICY, count), algo
        flags = cli.build_parser().parse_args(["train", "--env", "CartPole-v1", "--algo", algo])
        spec = train.build_spec(flags)
        assert "scaler" not in spec and not sdk.spec_to_proto(spec).HasField("scaler")
        sent = scaler_spec(validate(from_proto(sdk.spec_to_proto(spec))))  # what the learner asks the scaler for
        assert (sent.policy, sent.fixed_actors) == (c.DEFAULT_SCALING_POLICY, count), algo
        assert actors(*policy_params(sent)) == count
        # The dataclass's own wire round trip, and "fixed" with no count.
        wire = sdk.spec_to_proto(TrainingSpec(env_id="CartPole-v1", algo=algo))
        assert not wire.scaler.HasField("fixed_actors")  # unset, not 0: what a learner of any version reads right
        assert validate(from_proto(wire)).scaler.fixed_actors == count
        bare = validate(from_proto(sdk.spec_to_proto({"env_id": "CartPole-v1", "algo": algo, "scaler": "fixed"})))
        assert bare.scaler.fixed_actors == count
    # A count the user gives wins over the algorithm's.
    explicit = validate(from_proto(sdk.spec_to_proto({"env_id": "CartPole-v1", "algo": "impact", "scaler": "fixed:8"})))
    assert explicit.scaler.fixed_actors == 8
    assert validate(TrainingSpec(env_id="CartPole-v1", algo="impact",
                                 scaler=ScalerSettings(fixed_actors=8))).scaler.fixed_actors == 8
    # The scaler service: a ScalerSpec with no policy and no count (the wire's unset values; the learner always
    # sends the validated count, so only a direct caller gets this).
    assert policy_params(common_pb2.ScalerSpec()) == (c.DEFAULT_SCALING_POLICY, {"actors": c.FIXED_ACTORS})
    assert actors(*policy_params(common_pb2.ScalerSpec())) == c.FIXED_ACTORS
    for algo, count in c.FIXED_ACTORS_BY_ALGO.items():  # with the job's algorithm, as the learner sends it
        assert policy_params(common_pb2.ScalerSpec(), algo) == (c.DEFAULT_SCALING_POLICY, {"actors": count})
    assert actors(c.DEFAULT_SCALING_POLICY, {}) == c.FIXED_ACTORS  # "fixed" with no count
    # The CLI's --help names the default per algorithm.
    expected = ", ".join(f"{c.DEFAULT_SCALING_POLICY}:{n} for {a}" for a, n in c.FIXED_ACTORS_BY_ALGO.items())
    assert train.default_scaler() == expected
    train_help = next(a for a in cli.build_parser()._subparsers._group_actions[0].choices["train"]._actions
                      if "--scaler" in a.option_strings).help
    assert train_help.endswith(f"[{expected}]")


def test_fixed_actors_out_of_range_names_the_field():
    from nitro.spec import InvalidSpec, TrainingSpec, validate

    with pytest.raises(InvalidSpec, match=r"scaler.fixed_actors: must be in \[1, 1000\] \(0: the algorithm's default"):
        validate(TrainingSpec(env_id="CartPole-v1", scaler=ScalerSettings(fixed_actors=-1)))
