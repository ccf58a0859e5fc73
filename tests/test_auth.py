"""Token authentication and TLS on in-process gRPC servers built like the services (nitro.rpc.grpc_util.Service).

Covers: token loading (env, file, rotation list, bad values), the server
interceptor (missing / malformed / wrong / right token, streams, health open,
reflection closed, nothing echoed or logged), request guard (unparsable bytes,
4 MB limit, bounded error details), TLS with a self-signed certificate made
here, the learner's detector/scaler stubs carrying token and TLS, and services
refusing to start without a token.
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import logging
import os
import subprocess
import sys

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from nitro.client.sdk import NitroClient, UnauthenticatedError
from nitro.errors import ConfigError
from nitro.rpc import auth, grpc_util
from nitro.rpc.grpc_util import Service, make_channel
from nitro.v1 import detector_pb2, detector_pb2_grpc, training_pb2, training_pb2_grpc

TOKEN = "tok-" + "a1B2" * 8
OTHER = "tok-" + "z9Y8" * 8
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# --- token loading ------------------------------------------------------------------------


def test_token_from_env_wins_over_file(tmp_path):
    f = tmp_path / "token"
    f.write_text(OTHER + "\n")
    assert auth.load_tokens({"NITRO_TOKEN": TOKEN, "NITRO_TOKEN_FILE": str(f)}) == [TOKEN]
    assert auth.load_tokens({"NITRO_TOKEN_FILE": str(f)}) == [OTHER]
    assert auth.load_tokens({}) == [] and auth.load_token({}) is None


def test_token_file_lists_accepted_tokens_first_is_sent(tmp_path):
    f = tmp_path / "token"
    f.write_text(f"# rotation: new first, old until every client moved\n{TOKEN}\n\n{OTHER}\n")
    f.chmod(0o600)
    assert auth.load_tokens({"NITRO_TOKEN_FILE": str(f)}) == [TOKEN, OTHER]
    assert auth.load_token({"NITRO_TOKEN_FILE": str(f)}) == TOKEN


@pytest.mark.parametrize("bad,match", [("short", "16-4096"), ("x" * 5000, "16-4096"),
                                       ("has a space in it!!", "printable ASCII"),
                                       ("ünïcödé-token-1234567", "printable ASCII")])
def test_bad_tokens_are_refused_without_echo(bad, match):
    with pytest.raises(ConfigError, match=match) as err:
        auth.load_tokens({"NITRO_TOKEN": bad})
    assert bad not in str(err.value)


def test_unreadable_or_empty_token_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot be read"):
        auth.load_tokens({"NITRO_TOKEN_FILE": str(tmp_path / "missing")})
    (tmp_path / "empty").write_text("\n# nothing\n")
    with pytest.raises(ConfigError, match="holds no token"):
        auth.load_tokens({"NITRO_TOKEN_FILE": str(tmp_path / "empty")})


def test_world_readable_token_file_warns(tmp_path, caplog):
    f = tmp_path / "token"
    f.write_text(TOKEN)
    f.chmod(0o644)
    with caplog.at_level(logging.WARNING, logger="nitro.rpc.auth"):
        auth.load_tokens({"NITRO_TOKEN_FILE": str(f)})
    assert "chmod 600" in caplog.text and TOKEN not in caplog.text


def test_fingerprint_hides_the_token():
    fp = auth.fingerprint(TOKEN)
    assert fp.startswith("sha256:") and TOKEN not in fp and fp == auth.fingerprint(TOKEN)
    assert auth.fingerprint(OTHER) != fp
    assert len(auth.generate_token()) >= auth.MIN_TOKEN_CHARS


def test_generated_tokens_never_start_with_a_dash(monkeypatch):
    """A token starting with "-" is easily taken for an option where one is written next to flags."""
    dash, plain = "-" + "a" * 42, "b" * 43
    draws = iter([dash, plain])
    monkeypatch.setattr(auth.secrets, "token_urlsafe", lambda n: next(draws))
    assert auth.generate_token() == plain


def test_client_token_precedence(monkeypatch):
    monkeypatch.delenv("NITRO_TOKEN", raising=False)
    monkeypatch.delenv("NITRO_TOKEN_FILE", raising=False)
    assert auth.client_token("127.0.0.1:1") is None
    auth.remember_local_token("127.0.0.1:1", OTHER)
    try:
        assert auth.client_token("127.0.0.1:1") == OTHER
        assert auth.client_token("127.0.0.1:2") is None, "a local token never goes to another address"
        monkeypatch.setenv("NITRO_TOKEN", TOKEN)
        assert auth.client_token("127.0.0.1:1") == TOKEN
        assert auth.client_token("127.0.0.1:1", "explicit-token-123456") == "explicit-token-123456"
    finally:
        auth.forget_local_token("127.0.0.1:1")


# --- an in-process service with auth -------------------------------------------------------


class Trainer(training_pb2_grpc.TrainingServiceServicer):
    def GetTraining(self, request, context):
        if request.job_id != "known":
            context.abort(grpc.StatusCode.NOT_FOUND, f"no training job with id {request.job_id!r}")
        return training_pb2.TrainingStatus(job_id="known")

    def ListTrainings(self, request, context):
        return training_pb2.ListTrainingsResponse(jobs=[training_pb2.TrainingStatus(job_id="known")])

    def WatchTraining(self, request, context):
        yield training_pb2.RoundReport(job_id=request.job_id, round=0)


def start_service(tokens=(TOKEN,), credentials=None) -> Service:
    interceptors = [auth.TokenAuthInterceptor(list(tokens))] if tokens else []
    svc = Service("test", "127.0.0.1", 0, max_workers=4, interceptors=interceptors, server_credentials=credentials)
    svc.add("nitro.v1.TrainingService", lambda s: training_pb2_grpc.add_TrainingServiceServicer_to_server(Trainer(), s))
    svc.start()
    return svc


@pytest.fixture(scope="module")
def service():
    svc = start_service(tokens=(TOKEN, OTHER))
    yield svc
    svc.stop(0)


def call(address, metadata=None, method="ListTrainings", request=None, **channel_kw):
    with grpc.insecure_channel(address, **channel_kw) as ch:
        stub = training_pb2_grpc.TrainingServiceStub(ch)
        request = request or getattr(training_pb2, f"{method}Request")()
        result = getattr(stub, method)(request, timeout=5, metadata=metadata)
        return list(result) if method == "WatchTraining" else result


def code_of(fn) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as err:
        fn()
    return err.value.code(), err.value.details()


@pytest.mark.parametrize("metadata,reason", [
    (None, "missing"),
    ((("authorization", "Bearer " + "w" * 40),), "invalid"),
    ((("authorization", "Basic dXNlcjpwYXNz"),), "malformed"),
    ((("authorization", "Bearer"),), "malformed"),
    ((("authorization", "Bearer " + TOKEN[:-1]),), "invalid"),
    ((("authorization", "Bearer " + TOKEN + "x"),), "invalid"),
    ((("x-token", TOKEN),), "missing"),
])
@pytest.mark.parametrize("method", ["ListTrainings", "WatchTraining"])
def test_refused_without_the_right_token(service, metadata, reason, method):
    before = auth.AUTH_FAILURES.labels(reason)._value.get()
    code, details = code_of(lambda: call(service.address, metadata, method))
    assert code == grpc.StatusCode.UNAUTHENTICATED
    assert details and TOKEN not in details and "w" * 40 not in details
    assert ("missing" in details) if reason == "missing" else True
    assert auth.AUTH_FAILURES.labels(reason)._value.get() == before + 1


@pytest.mark.parametrize("token", [TOKEN, OTHER])
def test_every_accepted_token_works(service, token):
    resp = call(service.address, (("authorization", f"Bearer {token}"),))
    assert [j.job_id for j in resp.jobs] == ["known"]
    reports = call(service.address, (("authorization", f"bearer {token}"),), "WatchTraining",
                   training_pb2.WatchTrainingRequest(job_id="j"))
    assert [r.job_id for r in reports] == ["j"]


def test_health_is_open_reflection_is_not(service):
    assert grpc_util.check_health(service.address)
    assert grpc_util.check_health(service.address, "nitro.v1.TrainingService")
    with grpc.insecure_channel(service.address) as ch:
        stub = reflection_pb2_grpc.ServerReflectionStub(ch)
        req = [reflection_pb2.ServerReflectionRequest(list_services="")]
        with pytest.raises(grpc.RpcError) as err:
            next(stub.ServerReflectionInfo(iter(req), timeout=5))
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        resp = next(stub.ServerReflectionInfo(iter(req), timeout=5, metadata=(("authorization", f"Bearer {TOKEN}"),)))
        assert "nitro.v1.TrainingService" in {s.name for s in resp.list_services_response.service}
        watch = health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest(service=""), timeout=5)
        assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
        watch.cancel()


def test_nothing_secret_in_logs(service, caplog, monkeypatch):
    monkeypatch.setenv("NITRO_TOKEN", TOKEN)
    with caplog.at_level(logging.DEBUG):
        auth.server_security(argparse.Namespace(host="127.0.0.1", insecure_no_auth=False), "test")
        for md in (None, (("authorization", "Bearer " + "w" * 40),), (("authorization", f"Bearer {TOKEN}"),)):
            try:
                call(service.address, md)
            except grpc.RpcError:
                pass
    assert "token authentication on" in caplog.text and auth.fingerprint(TOKEN) in caplog.text
    assert TOKEN not in caplog.text and "w" * 40 not in caplog.text


def test_failure_warnings_are_rate_limited(caplog):
    log = auth._FailureLog(interval_s=60)
    with caplog.at_level(logging.WARNING, logger="nitro.rpc.auth"):
        for _ in range(50):
            log.warn("/m", "invalid access token")
    assert caplog.text.count("refused /m") == 1


def test_sdk_sends_token_and_maps_unauthenticated(service, monkeypatch):
    monkeypatch.delenv("NITRO_TOKEN", raising=False)
    monkeypatch.delenv("NITRO_TOKEN_FILE", raising=False)
    with NitroClient(service.address, timeout=5) as c, pytest.raises(UnauthenticatedError, match="missing"):
        c.list()
    with NitroClient(service.address, token=TOKEN, timeout=5) as c:
        assert [j.job_id for j in c.list()] == ["known"]
    monkeypatch.setenv("NITRO_TOKEN", OTHER)
    with NitroClient(service.address, timeout=5) as c:
        assert c.get("known").job_id == "known"


def test_channel_with_token_reaches_streams_too(service):
    ch = make_channel(service.address, token=TOKEN)
    try:
        stub = training_pb2_grpc.TrainingServiceStub(ch)
        assert stub.ListTrainings(training_pb2.ListTrainingsRequest(), timeout=5).jobs
        assert [r.round for r in stub.WatchTraining(training_pb2.WatchTrainingRequest(job_id="x"), timeout=5)] == [0]
    finally:
        ch.close()


# --- request guard: bytes, sizes, messages ---------------------------------------------------------


AUTH_MD = (("authorization", f"Bearer {TOKEN}"),)


@pytest.mark.parametrize("raw", [b"\xff\xff\xff", b"\x0a\x05ab", b"\x0a\x02\xc3\x28", b"\x08" * 11])
def test_unparsable_request_is_invalid_argument(service, raw):
    with grpc.insecure_channel(service.address) as ch:
        fn = ch.unary_unary("/nitro.v1.TrainingService/GetTraining")
        code, details = code_of(lambda: fn(raw, timeout=5, metadata=AUTH_MD))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "not a valid" in details


def test_unauthenticated_request_is_not_parsed(service):
    with grpc.insecure_channel(service.address) as ch:
        fn = ch.unary_unary("/nitro.v1.TrainingService/GetTraining")
        code, _ = code_of(lambda: fn(b"\xff\xff", timeout=5))
    assert code == grpc.StatusCode.UNAUTHENTICATED


def test_request_over_4mb_is_resource_exhausted_by_the_server(service):
    big = training_pb2.GetTrainingRequest(job_id="j" * (grpc_util.MAX_MESSAGE_BYTES + 10))
    opts = [("grpc.max_send_message_length", 64 << 20)]  # the server, not the client, must refuse it
    code, details = code_of(lambda: call(service.address, AUTH_MD, "GetTraining", big, options=opts))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in details
    # Our own channels refuse to send it at all.
    ch = make_channel(service.address, token=TOKEN)
    try:
        stub = training_pb2_grpc.TrainingServiceStub(ch)
        code, _ = code_of(lambda: stub.GetTraining(big, timeout=5))
    finally:
        ch.close()
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_error_details_echoing_huge_input_are_truncated(service):
    near_limit = training_pb2.GetTrainingRequest(job_id="j" * (grpc_util.MAX_MESSAGE_BYTES - 64))
    code, details = code_of(lambda: call(service.address, AUTH_MD, "GetTraining", near_limit))
    assert code == grpc.StatusCode.NOT_FOUND, details  # not "metadata size exceeds hard limit"
    assert details.startswith("no training job with id 'jjj") and len(details) <= grpc_util.MAX_STATUS_DETAILS


# --- refusing to start, TLS -----------------------------------------------------------------------


def test_server_security_requires_a_token_or_explicit_insecure(monkeypatch, caplog):
    monkeypatch.delenv("NITRO_TOKEN", raising=False)
    monkeypatch.delenv("NITRO_TOKEN_FILE", raising=False)
    with pytest.raises(ConfigError, match="no access token configured.*--insecure-no-auth"):
        auth.server_security(argparse.Namespace(host="127.0.0.1", insecure_no_auth=False), "learner")
    with caplog.at_level(logging.WARNING):
        sec = auth.server_security(argparse.Namespace(host="0.0.0.0", insecure_no_auth=True), "learner")
    assert sec.interceptors == [] and "OFF" in caplog.text and "anyone" in caplog.text
    monkeypatch.setenv("NITRO_TOKEN", TOKEN)
    sec = auth.server_security(argparse.Namespace(host="127.0.0.1", insecure_no_auth=False), "learner")
    assert isinstance(sec.interceptors[0], auth.TokenAuthInterceptor) and sec.token == TOKEN
    with pytest.raises(ConfigError, match="together"):
        auth.server_security(argparse.Namespace(host="127.0.0.1", tls_cert="c.pem", tls_key=None), "learner")


@pytest.mark.timeout(120)
def test_service_process_refuses_to_start_without_token(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("NITRO_TOKEN", "NITRO_TOKEN_FILE")}
    env.update(NITRO_HMAC_KEY="ab" * 32, PYTHONPATH=REPO)
    proc = subprocess.run([sys.executable, "-m", "scaler_svc", "--port", "0", "--metrics-port", "0",
                           "--lambda-endpoint", "http://127.0.0.1:1"], env=env, capture_output=True, text=True,
                          timeout=100, cwd=tmp_path)
    assert proc.returncode != 0
    assert "no access token configured" in proc.stderr and "Traceback" not in proc.stderr


def make_cert(tmp_path) -> tuple[str, str]:
    """A self-signed certificate for 127.0.0.1 and localhost: (cert path, key path)."""
    crypto = pytest.importorskip("cryptography")
    del crypto
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "nitro-test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    key_path.chmod(0o600)
    return str(cert_path), str(key_path)


@pytest.fixture(scope="module")
def tls(tmp_path_factory):
    cert, key = make_cert(tmp_path_factory.mktemp("tls"))
    args = argparse.Namespace(host="127.0.0.1", insecure_no_auth=False, tls_cert=cert, tls_key=key)
    os.environ["NITRO_TOKEN"] = TOKEN
    try:
        sec = auth.server_security(args, "test")
    finally:
        del os.environ["NITRO_TOKEN"]
    svc = Service("tls", "127.0.0.1", 0, interceptors=sec.interceptors, server_credentials=sec.credentials)
    svc.add("nitro.v1.TrainingService", lambda s: training_pb2_grpc.add_TrainingServiceServicer_to_server(Trainer(), s))
    svc.start()
    yield svc, cert
    svc.stop(0)


def test_tls_with_token(tls):
    svc, ca = tls
    with NitroClient(svc.address, token=TOKEN, tls_ca=ca, timeout=5) as c:
        assert [j.job_id for j in c.list()] == ["known"]
    with NitroClient(svc.address, token=OTHER, tls_ca=ca, timeout=5) as c, pytest.raises(UnauthenticatedError):
        c.list()
    assert grpc_util.check_health(svc.address, credentials=auth.channel_credentials(ca))


def test_plaintext_client_cannot_talk_to_tls_server(tls):
    svc, _ = tls
    code, _ = code_of(lambda: call(svc.address, AUTH_MD))
    assert code == grpc.StatusCode.UNAVAILABLE
    assert not grpc_util.check_health(svc.address)


@pytest.mark.slow
def test_tls_client_refuses_an_untrusted_server(tls, tmp_path):
    svc, _ = tls
    other_ca, _ = make_cert(tmp_path)
    with NitroClient(svc.address, token=TOKEN, tls_ca=other_ca, timeout=5) as c:
        with pytest.raises(Exception) as err:
            c.list()
    assert getattr(err.value, "code", None) == grpc.StatusCode.UNAVAILABLE


def test_missing_ca_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot be read"):
        auth.channel_credentials(str(tmp_path / "nope.pem"))


# --- the learner's own calls to the detector and scaler --------------------------------------------


class Detector(detector_pb2_grpc.BoostingDetectorServicer):
    def Score(self, request, context):
        return detector_pb2.ScoreResponse(score=0.5, samples_used=request.round)


def test_learner_stubs_carry_token_over_tls(tls, tmp_path, monkeypatch):
    _, ca = tls
    cert, key = make_cert(tmp_path)
    det = Service("det", "127.0.0.1", 0, interceptors=[auth.TokenAuthInterceptor([TOKEN])],
                  server_credentials=grpc.ssl_server_credentials([(open(key, "rb").read(), open(cert, "rb").read())]))
    det.add("nitro.v1.BoostingDetector",
            lambda s: detector_pb2_grpc.add_BoostingDetectorServicer_to_server(Detector(), s))
    det.start()
    from learner_svc import server as learner

    monkeypatch.setenv("NITRO_TOKEN", TOKEN)
    monkeypatch.setenv("NITRO_HMAC_KEY", "cd" * 32)
    args = learner.parse_args(["--port", "0", "--redis-url", "redis://127.0.0.1:1/0", "--detector", det.address,
                               "--scaler", "127.0.0.1:1", "--data-dir", str(tmp_path), "--tls-ca", cert])
    service, servicer = learner.build(args)
    try:
        resp = servicer.deps.detector.Score(detector_pb2.ScoreRequest(job_id="j", round=7), timeout=10)
        assert resp.samples_used == 7
        monkeypatch.setenv("NITRO_TOKEN", OTHER)  # a learner with another token is refused
        _, other = learner.build(args)
        code, _ = code_of(lambda: other.deps.detector.Score(detector_pb2.ScoreRequest(job_id="j"), timeout=10))
        assert code == grpc.StatusCode.UNAUTHENTICATED
    finally:
        det.stop(0)
        service.server.stop(0)


def test_every_listener_binds_loopback_by_default():
    from detector_svc import server as detector
    from learner_svc import server as learner
    from nitro.local.lambda_endpoint.__main__ import build_parser as lambda_parser
    from nitro.local.redis_server import LocalRedis
    from scaler_svc import server as scaler

    for mod in (learner, detector, scaler):
        args = mod.parse_args([])
        assert (args.host, args.metrics_host) == ("127.0.0.1", "127.0.0.1"), mod.__name__
        assert args.insecure_no_auth is False
    assert lambda_parser().parse_args([]).host == "127.0.0.1"
    r = LocalRedis(port=1, data_dir="/nonexistent")
    assert "bind 127.0.0.1" in r._config_text().splitlines()
